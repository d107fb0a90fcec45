"""OTLP/HTTP receiver, decoding and validation, spool, batch writer into ClickHouse, serve.

Pure parts: decode_request / decode_protobuf / decode_json (OTLP -> otel_traces columns,
validated), check_handoff_span, write_batch (one idempotent ingest batch), ingest_requests /
read_requests (files). Shells: Spool, Ingestor, the OTLP receivers. Test data: ingest.testing.
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
    "Ingestor": "_service",
    "OVERLAP_MAX_RSS": "_service",
    "SQL_MIN_BYTES": "_service",
    "OtlpConfig": "_otlp_http",
    "make_otlp_server": "_otlp_http",
    "GrpcConfig": "_otlp_grpc",
    "start_grpc_server": "_otlp_grpc",
    "Telemetry": "_telemetry",
    "Stager": "chdb",
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
    from ingest._otlp_grpc import GrpcConfig, start_grpc_server
    from ingest._otlp_http import OtlpConfig, make_otlp_server
    from ingest._service import Ingestor, StoreUnavailable
    from ingest._spool import Spool, SpoolFull, SpoolLocked, SpoolRecord
    from ingest._telemetry import Telemetry
    from ingest._validate import TENANT_MISMATCH, CheckResult, check_handoff_span
    from ingest._verify import ChainReport, verify_chain
    from ingest._writer import BatchResult, last_chain_hash, make_token, write_batch
    from ingest.chdb import Stager

__all__ = [
    "OVERLAP_MAX_RSS",
    "SQL_MIN_BYTES",
    "TENANT_MISMATCH",
    "BatchResult",
    "ChainReport",
    "CheckResult",
    "DecodeError",
    "DecodedBatch",
    "GrpcConfig",
    "IngestSummary",
    "Ingestor",
    "OtlpConfig",
    "Reject",
    "Spool",
    "SpoolFull",
    "SpoolLocked",
    "SpoolRecord",
    "Stager",
    "StoreUnavailable",
    "Telemetry",
    "check_handoff_span",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "ingest_requests",
    "last_chain_hash",
    "make_otlp_server",
    "make_token",
    "read_requests",
    "start_grpc_server",
    "verify_chain",
    "write_batch",
]
