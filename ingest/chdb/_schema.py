"""What the chDB decoding query reads and writes: the Protobuf schema, the staging table's
columns, the query settings, SQL literals. Pure (constants and text).

The schema is `otlp_ingest.proto` beside this module: a copy of the OTLP trace messages
(field numbers and wire types as in opentelemetry-proto; nested values the engine does not
need kept as bytes) plus the fields each framed record adds (ingest.chdb._framing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = [
    "LEAN",
    "OTEL_FROM_STAGE",
    "PROTO",
    "STAGE_COLUMNS",
    "STAGE_DATABASE",
    "STAGE_DDL",
    "STREAM_COLUMNS",
    "STRUCTURE",
    "inline_settings",
    "read_settings",
    "sql_string",
]

PROTO: Final = Path(__file__).resolve().with_name("otlp_ingest.proto")

#: the oneof presence column (input_format_protobuf_oneof_presence): the field number of the
#: value that is set, 0 for none (ingest._wire_rules.TAG_IDS); Int8 rather than an Enum
#: keeps type names short, which ClickHouse's analyser handles measurably faster
_TAGS: Final = "Int8"
_VALUE: Final = (
    f"Tuple(value {_TAGS}, string_value String, bool_value Bool, int_value Int64, "
    f"array_value Tuple(values Array(Tuple(value {_TAGS}, string_value String, "
    "int_value Int64))))"
)
_ATTRS: Final = f"Array(Tuple(key String, value {_VALUE}))"
#: the columns ClickHouse reads from each record (names match the .proto fields)
STRUCTURE: Final = (
    "ingest_batch String, received_at_ms UInt64, tenant String, tenant_json String, "
    "resource_spans Array(Tuple("
    f"resource Tuple(attributes {_ATTRS}), "
    "scope_spans Array(Tuple("
    "scope Tuple(name String, version String), "
    "spans Array(Tuple(trace_id String, span_id String, trace_state String, "
    "parent_span_id String, name String, kind Int32, start_time_unix_nano UInt64, "
    f"end_time_unix_nano UInt64, attributes {_ATTRS}, events Array(String), "
    "links Array(String), status Tuple(message String, code Int32)))))))"
)

#: columns of the staging table, in stage_select's order
STAGE_COLUMNS: Final = (
    ("Timestamp", "DateTime64(9, 'UTC')"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", "String"),
    ("SpanKind", "String"),
    ("ServiceName", "String"),
    ("ResourceAttributes", "Map(String, String)"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", "Map(String, String)"),
    ("Duration", "UInt64"),
    ("StatusCode", "String"),
    ("StatusMessage", "String"),
    ("Tenant", "String"),
    ("IngestBatch", "String"),
    ("ingested_at", "DateTime64(3, 'UTC')"),
    ("handoff_id", "String"),
    ("is_handoff", "UInt8"),
    ("row_hash", "String"),
    ("ok", "UInt8"),
)
#: the otel_traces columns the stage fills (the rest take the table's defaults)
OTEL_FROM_STAGE: Final = tuple(c for c, _ in STAGE_COLUMNS[:17])
STAGE_DDL: Final = ", ".join(f"`{n}` {t}" for n, t in STAGE_COLUMNS)
#: the stream's column order: what the stager reads from each block comes first
_STREAM_FIRST: Final = ("IngestBatch", "ok", "is_handoff", "row_hash")
STREAM_COLUMNS: Final = (*_STREAM_FIRST, *(c for c, _ in STAGE_COLUMNS if c not in _STREAM_FIRST))

STAGE_DATABASE: Final = "_handoffs_stage"  # Memory engine: nothing in it outlives serve


def sql_string(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: Settings of every ingest query (decoding, summary, writes; the materialized views run
#: with their insert's). No LLVM JIT: ClickHouse compiles an expression the third time it sees
#: it, per distinct expression (the writes' batch-id constants make new ones): in serve 16
#: compilations cost ~0.38 s of ~3.5 s of query CPU per 100,000 spans, for string work that
#: compiled code does not speed up. No AND-chain comparison inference: an analyser pass that
#: finds nothing to do here and cost ~11 ms of the decoding query's ~33 ms of analysis
#: (measured with system.events, bench/ingest_throughput.py; chDB 26.9).
LEAN: Final = {
    "compile_expressions": "0",
    "compile_aggregate_expressions": "0",
    "compile_sort_description": "0",
    "optimize_and_compare_chain": "0",
}


def read_settings() -> dict[str, str]:
    """Settings of the decoding query. One request per input block (max_block_size 1: the
    Protobuf reader's rows are whole requests) keeps a query's memory to one request's
    columns (~25 MB per 5,000 spans instead of ~100 MB per 20,000) and is no slower."""
    return {
        "format_schema": f"{PROTO}:Request",
        "input_format_protobuf_oneof_presence": "1",
        "max_block_size": "1",
        "max_threads": "1",
        "output_format_json_escape_forward_slashes": "0",
        # plan-level optimizations find nothing to do in this projection-only query but
        # cost ~13 ms of its fixed ~60 ms (measured on an empty and a 2x5,000-span input)
        "query_plan_enable_optimizations": "0",
        **LEAN,
    }


def inline_settings(settings: dict[str, str]) -> str:
    """`k = v, ...` for a query's own SETTINGS clause (values quoted as strings)."""
    return ", ".join(f"{k} = {sql_string(v)}" for k, v in settings.items())
