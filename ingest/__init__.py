"""OTLP/HTTP receiver, decoding and validation, spool, batch writer into ClickHouse, serve.

Pure parts: decode_request / decode_protobuf / decode_json (OTLP -> otel_traces columns,
validated), check_handoff_span, write_batch (one idempotent ingest batch), ingest_requests /
read_requests (files). Shells: Spool, Ingestor, the OTLP receivers, PartsWatch (their gate:
503 while a table holds too many active parts). Test data: ingest.testing.
"""

from typing import TYPE_CHECKING

from foundation.lazy import lazy_exports

# Lazy (PEP 562): `handoffs --help` and the CLI routing import ingest._cli without paying for
# clickhouse-connect, protobuf and the HTTP servers.
_WHERE = {
    "DecodedBatch": "ingest._decode",
    "DecodeError": "ingest._decode",
    "Reject": "ingest._decode",
    "decode_json": "ingest._decode_json",
    "decode_protobuf": "ingest._decode",
    "decode_request": "ingest._decode",
    "IngestSummary": "ingest._files",
    "ingest_requests": "ingest._files",
    "read_requests": "ingest._files",
    "Ingestor": "ingest._service",
    "OVERLAP_MAX_RSS": "ingest._service",
    "SQL_JOIN_MIN_BYTES": "ingest._service",
    "SQL_MIN_BYTES": "ingest._service",
    "OtlpConfig": "ingest._otlp_http",
    "make_otlp_server": "ingest._otlp_http",
    "GrpcConfig": "ingest._otlp_grpc",
    "start_grpc_server": "ingest._otlp_grpc",
    "Telemetry": "ingest._telemetry",
    "PartsWatch": "ingest._parts",
    "TooManyParts": "ingest._parts",
    "Stager": "ingest.chdb",
    "StoreUnavailable": "foundation.store",
    "Spool": "ingest._spool",
    "SpoolClosed": "ingest._spool",
    "SpoolFull": "ingest._spool",
    "SpoolLocked": "ingest._spool",
    "SpoolRecord": "ingest._spool",
    "TENANT_MISMATCH": "ingest._validate",
    "CheckResult": "ingest._validate",
    "check_handoff_span": "ingest._validate",
    "BatchResult": "ingest._inserts",
    "last_chain_hash": "ingest._inserts",
    "make_token": "ingest._inserts",
    "write_batch": "ingest._inserts",
    "ChainReport": "ingest._verify",
    "verify_chain": "ingest._verify",
}


lazy_exports(__name__, _WHERE)


if TYPE_CHECKING:
    from foundation.store import StoreUnavailable
    from ingest._decode import (
        DecodedBatch,
        DecodeError,
        Reject,
        decode_protobuf,
        decode_request,
    )
    from ingest._decode_json import decode_json
    from ingest._files import IngestSummary, ingest_requests, read_requests
    from ingest._inserts import BatchResult, last_chain_hash, make_token, write_batch
    from ingest._otlp_grpc import GrpcConfig, start_grpc_server
    from ingest._otlp_http import OtlpConfig, make_otlp_server
    from ingest._parts import PartsWatch, TooManyParts
    from ingest._service import OVERLAP_MAX_RSS, SQL_JOIN_MIN_BYTES, SQL_MIN_BYTES, Ingestor
    from ingest._spool import Spool, SpoolClosed, SpoolFull, SpoolLocked, SpoolRecord
    from ingest._telemetry import Telemetry
    from ingest._validate import TENANT_MISMATCH, CheckResult, check_handoff_span
    from ingest._verify import ChainReport, verify_chain
    from ingest.chdb import Stager

__all__ = [
    "OVERLAP_MAX_RSS",
    "SQL_JOIN_MIN_BYTES",
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
    "PartsWatch",
    "Reject",
    "Spool",
    "SpoolClosed",
    "SpoolFull",
    "SpoolLocked",
    "SpoolRecord",
    "Stager",
    "StoreUnavailable",
    "Telemetry",
    "TooManyParts",
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
