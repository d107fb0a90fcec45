"""The rules both decoders follow (Python over protobuf or JSON, and chDB's SQL). Pure.

One definition per fact: the limits a span must keep, the names stored for span kinds and
status codes, how an attribute value becomes the stored string, and where each row-hash
field comes from. ingest._decode and ingest._decode_json use these values; ingest.chdb
builds its SQL text from them, so the two paths cannot drift apart.

Value encoding (as the OpenTelemetry Collector's ClickHouse exporter, pdata
`Value.AsString`): strings as is, ints in decimal, doubles shortest round-trip (NaN, +Inf,
-Inf; integral values below 1e21 without a fraction), bools `true`/`false`, arrays and maps
as compact JSON (UTF-8 kept), bytes as base64.
"""

from __future__ import annotations

import json
from typing import Any, Final

from collector import semconv
from foundation.integrity import HASHED_COLUMNS

__all__ = [
    "BOOL_TEXT",
    "KINDS",
    "KIND_IDS",
    "KIND_NAMES",
    "MAX_ATTRIBUTES",
    "MAX_NS",
    "MAX_VALUE_CHARS",
    "ROW_HASH_ATTRIBUTE",
    "SERVICE_NAME",
    "STATUS",
    "STATUS_IDS",
    "STATUS_NAMES",
    "TAG_IDS",
    "dumps",
    "fmt_double",
]

#: A span with more attributes than this is rejected whole (never truncated: what is stored
#: is what was sent). OTel SDKs default to 128.
MAX_ATTRIBUTES: Final = 1024
#: The longest attribute value, in characters after encoding (the SQL path counts the
#: joined values, which is never less).
MAX_VALUE_CHARS: Final = 1 << 20
#: Timestamps must be below this, in nanoseconds since the epoch: DateTime64(9) is Int64
#: nanoseconds (2262-04-11).
MAX_NS: Final = 2**63

#: Stored SpanKind by OTLP kind number; a number out of range is stored as KINDS[0].
KINDS: Final = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
#: OTLP/JSON enum names of the kinds -> number.
KIND_IDS: Final = {f"SPAN_KIND_{k.upper()}": i for i, k in enumerate(KINDS)}
#: Stored StatusCode by OTLP status code; out of range is stored as STATUS[0].
STATUS: Final = ("Unset", "Ok", "Error")
#: OTLP/JSON enum names of the status codes -> number.
STATUS_IDS: Final = {f"STATUS_CODE_{s.upper()}": i for i, s in enumerate(STATUS)}

#: A bool value as stored, by the value (BOOL_TEXT[True] == "true").
BOOL_TEXT: Final = ("false", "true")
#: The resource attribute stored as ServiceName ('' when absent).
SERVICE_NAME: Final = "service.name"

#: OTLP AnyValue field -> its number in the AnyValue oneof (what chDB's oneof presence
#: column holds; 0 for none).
TAG_IDS: Final = {
    "string_value": 1, "bool_value": 2, "int_value": 3, "double_value": 4,
    "array_value": 5, "kvlist_value": 6, "bytes_value": 7,
}  # fmt: skip

#: Row-hash fields taken from a span attribute (integrity.HASHED_COLUMNS; an absent one
#: hashes as ''). The others are the span's own: tenant, time_ns, trace_id, span_id, and
#: `attributes`, the whole map.
ROW_HASH_ATTRIBUTE: Final = {
    "actor": semconv.ACTOR,
    "event": semconv.EVENT,
    "from_state": semconv.FROM_STATE,
    "handoff_id": semconv.HANDOFF_ID,
    "task_id": semconv.TASK_ID,
    "to_state": semconv.TO_STATE,
}
_SPAN_FIELDS: Final = frozenset({"tenant", "time_ns", "trace_id", "span_id", "attributes"})
if set(HASHED_COLUMNS) != _SPAN_FIELDS | set(ROW_HASH_ATTRIBUTE):  # pragma: no cover
    raise ImportError("ingest._wire_rules: ROW_HASH_ATTRIBUTE does not cover HASHED_COLUMNS")


#: OTLP kind number -> stored SpanKind (`.get(kind, KINDS[0])`: a C call per span, not a
#: Python function)
KIND_NAMES: Final = dict(enumerate(KINDS))
#: OTLP status code -> stored StatusCode (`.get(code, STATUS[0])`)
STATUS_NAMES: Final = dict(enumerate(STATUS))


def fmt_double(v: float) -> str:
    """A double as stored: shortest round-trip text, NaN/+Inf/-Inf, integral without '.0'."""
    if v != v or v in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(v)]
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    return repr(v)


def dumps(v: Any) -> str:
    """An array or map value as stored: compact JSON, non-ASCII kept."""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
