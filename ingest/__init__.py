"""OTLP/HTTP receiver, decoding and validation, spool, batch writer into ClickHouse, serve.

Pure parts: decode_request / decode_protobuf / decode_json (OTLP -> otel_traces columns,
validated), check_handoff_span, write_batch (one idempotent ingest batch), ingest_requests /
read_requests (files). Shells: Spool, Ingestor, run_serve. Test helper: ingest.testing.
"""

from ingest._decode import (
    DecodedBatch,
    DecodeError,
    Reject,
    decode_json,
    decode_protobuf,
    decode_request,
)
from ingest._files import IngestSummary, ingest_requests, read_requests
from ingest._serve import ServeConfig, run_serve
from ingest._service import Ingestor, StoreUnavailable
from ingest._spool import Spool, SpoolFull, SpoolRecord
from ingest._validate import TENANT_MISMATCH, CheckResult, check_handoff_span
from ingest._writer import BatchResult, last_chain_hash, make_token, write_batch
from ingest.integrity import row_hash

__all__ = [
    "TENANT_MISMATCH",
    "BatchResult",
    "CheckResult",
    "DecodeError",
    "DecodedBatch",
    "IngestSummary",
    "Ingestor",
    "Reject",
    "ServeConfig",
    "Spool",
    "SpoolFull",
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
    "write_batch",
]
