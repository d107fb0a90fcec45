"""chDB decodes OTLP/protobuf requests in SQL, beside the Python decoder (ingest._decode).

Public surface: Stager (the decoding threads and staging tables), Staged (one staged
request) and StageTimeout (a decode not answered in time), plus what the writer needs to
read the staging tables (OTEL_FROM_STAGE, LEAN, inline_settings, sql_string,
STAGE_DATABASE) and the query builders. Modules: _schema
(Protobuf schema, columns, settings), _select (the decoding SQL), _framing (records for
the FIFO, varints), _native (reading Native blocks), _stream (the FIFO stream; the only
module touching clickhouse-connect internals), _stager (the Stager).
"""

from typing import TYPE_CHECKING

from foundation.lazy import lazy_exports

# Lazy (PEP 562): importing ingest.chdb for a name or two costs nothing until it is used.
_WHERE = {
    "LEAN": "ingest.chdb._schema",
    "OTEL_FROM_STAGE": "ingest.chdb._schema",
    "PROTO": "ingest.chdb._schema",
    "STAGE_COLUMNS": "ingest.chdb._schema",
    "STAGE_DATABASE": "ingest.chdb._schema",
    "inline_settings": "ingest.chdb._schema",
    "read_settings": "ingest.chdb._schema",
    "sql_string": "ingest.chdb._schema",
    "frame": "ingest.chdb._framing",
    "stage_select": "ingest.chdb._select",
    "stream_select": "ingest.chdb._select",
    "summarize": "ingest.chdb._native",
    "UnsupportedClient": "ingest.chdb._stream",
    "check_client_version": "ingest.chdb._stream",
    "Staged": "ingest.chdb._stager",
    "Stager": "ingest.chdb._stager",
    "StageTimeout": "ingest.chdb._stager",
}


lazy_exports(__name__, _WHERE)


if TYPE_CHECKING:
    from ingest.chdb._framing import frame
    from ingest.chdb._native import summarize
    from ingest.chdb._schema import (
        LEAN,
        OTEL_FROM_STAGE,
        PROTO,
        STAGE_COLUMNS,
        STAGE_DATABASE,
        inline_settings,
        read_settings,
        sql_string,
    )
    from ingest.chdb._select import stage_select, stream_select
    from ingest.chdb._stager import Staged, Stager, StageTimeout
    from ingest.chdb._stream import UnsupportedClient, check_client_version

__all__ = [
    "LEAN",
    "OTEL_FROM_STAGE",
    "PROTO",
    "STAGE_COLUMNS",
    "STAGE_DATABASE",
    "StageTimeout",
    "Staged",
    "Stager",
    "UnsupportedClient",
    "check_client_version",
    "frame",
    "inline_settings",
    "read_settings",
    "sql_string",
    "stage_select",
    "stream_select",
    "summarize",
]
