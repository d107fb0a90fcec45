"""OTLP/HTTP receiver, decoding and validation, spool, batch writer into ClickHouse, serve.

Pure parts: decode_request / decode_protobuf / decode_json (OTLP -> otel_traces columns,
validated), check_handoff_span, write_batch (one idempotent ingest batch), ingest_requests /
read_requests (files). Shells: Spool, Ingestor, run_serve. Test helper: ingest.testing.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Lazy (PEP 562): `handoffs --help` and the CLI routing import ingest._cli without paying for
# clickhouse-connect, protobuf and the HTTP servers.
_WHERE = {
    "DecodedBatch": "_decode",
    "DecodeError": "_decode",
    "Reject": "_decode",
    "decode_json": "_decode_json",
    "decode_protobuf": "_decode",
    "decode_request": "_decode",
    "IngestSummary": "_files",
    "ingest_requests": "_files",
    "read_requests": "_files",
    "ServeConfig": "_serve",
    "run_serve": "_serve",
    "Ingestor": "_service",
    "StoreUnavailable": "_service",
    "Spool": "_spool",
    "SpoolFull": "_spool",
    "SpoolLocked": "_spool",
    "SpoolRecord": "_spool",
    "TENANT_MISMATCH": "_validate",
    "CheckResult": "_validate",
    "check_handoff_span": "_validate",
    "BatchResult": "_writer",
    "last_chain_hash": "_writer",
    "make_token": "_writer",
    "write_batch": "_writer",
    "row_hash": "integrity",
    "ChainReport": "_verify",
    "verify_chain": "_verify",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"ingest.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")


if TYPE_CHECKING:
    from ingest._decode import (
        DecodedBatch,
        DecodeError,
        Reject,
        decode_protobuf,
        decode_request,
    )
    from ingest._decode_json import decode_json
    from ingest._files import IngestSummary, ingest_requests, read_requests
    from ingest._serve import ServeConfig, run_serve
    from ingest._service import Ingestor, StoreUnavailable
    from ingest._spool import Spool, SpoolFull, SpoolLocked, SpoolRecord
    from ingest._validate import TENANT_MISMATCH, CheckResult, check_handoff_span
    from ingest._verify import ChainReport, verify_chain
    from ingest._writer import BatchResult, last_chain_hash, make_token, write_batch
    from ingest.integrity import row_hash

__all__ = [
    "TENANT_MISMATCH",
    "BatchResult",
    "ChainReport",
    "CheckResult",
    "DecodeError",
    "DecodedBatch",
    "IngestSummary",
    "Ingestor",
    "Reject",
    "ServeConfig",
    "Spool",
    "SpoolFull",
    "SpoolLocked",
    "SpoolRecord",
    "StoreUnavailable",
    "check_handoff_span",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "ingest_requests",
    "last_chain_hash",
    "make_token",
    "read_requests",
    "row_hash",
    "run_serve",
    "verify_chain",
    "write_batch",
]
