"""chDB decodes OTLP/protobuf requests in SQL, beside the Python decoder (ingest._decode).

Public surface: Stager (the decoding threads and staging tables) and Staged (one staged
request), plus what the writer needs to read the staging tables (OTEL_FROM_STAGE, LEAN,
inline_settings, sql_string, STAGE_DATABASE) and the query builders. Modules: _schema
(Protobuf schema, columns, settings), _select (the decoding SQL), _framing (records for
the FIFO, varints), _native (reading Native blocks), _stream (the FIFO stream; the only
module touching clickhouse-connect internals), _stager (the Stager).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Lazy (PEP 562): importing ingest.chdb for a name or two costs nothing until it is used.
_WHERE = {
    "LEAN": "_schema",
    "OTEL_FROM_STAGE": "_schema",
    "PROTO": "_schema",
    "STAGE_COLUMNS": "_schema",
    "STAGE_DATABASE": "_schema",
    "inline_settings": "_schema",
    "read_settings": "_schema",
    "sql_string": "_schema",
    "frame": "_framing",
    "stage_select": "_select",
    "stream_select": "_select",
    "summarize": "_native",
    "UnsupportedClient": "_stream",
    "check_client_version": "_stream",
    "Staged": "_stager",
    "Stager": "_stager",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"ingest.chdb.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'ingest.chdb' has no attribute {name!r}")


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
    from ingest.chdb._stager import Staged, Stager
    from ingest.chdb._stream import UnsupportedClient, check_client_version

__all__ = [
    "LEAN",
    "OTEL_FROM_STAGE",
    "PROTO",
    "STAGE_COLUMNS",
    "STAGE_DATABASE",
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
