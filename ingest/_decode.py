"""OTLP trace requests (protobuf or JSON) -> columns of `otel_traces`, validated. Pure.

Attribute values are encoded into `Map(String, String)` the way the OpenTelemetry
Collector's ClickHouse exporter does (pdata `Value.AsString`): strings as is, ints in
decimal, doubles shortest round-trip, bools `true`/`false`, arrays and maps as JSON text,
bytes as base64. Ids are lowercase hex, kinds and status codes the exporter's names.

A request whose framing is bad (truncated protobuf, wrong JSON shape) raises DecodeError
(-> HTTP 400). A span that is well framed but breaks the wire contract (a wrong attribute
type, a missing required attribute, a malformed id) is rejected alone: it is listed in
`DecodedBatch.rejects` with the reason and counted in OTLP partial_success.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.message import DecodeError as _PbDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector import semconv
from foundation.integrity import span_row_hash
from ingest._validate import EXPECTED_TAG, check_handoff_span, type_problem

__all__ = [
    "OTEL_COLUMNS",
    "DecodeError",
    "DecodedBatch",
    "Reject",
    "decode_protobuf",
    "decode_request",
]

#: otel_traces columns filled by decode (Tenant and IngestBatch are added by the writer).
OTEL_COLUMNS: Final = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)
_KINDS: Final = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_KIND_NAMES: Final = {f"SPAN_KIND_{k.upper()}": i for i, k in enumerate(_KINDS)}
_STATUS: Final = ("Unset", "Ok", "Error")
_STATUS_NAMES: Final = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_SURROGATE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
MAX_SPAN_JSON: Final = 16_384  # bytes of a rejected span kept in ingest_rejects
#: A span with more attributes, or a longer attribute value (after encoding), is rejected
#: whole (never truncated: what is stored is what was sent). OTel SDKs default to 128.
MAX_ATTRIBUTES: Final = 1024
MAX_VALUE_CHARS: Final = 1 << 20


class DecodeError(ValueError):
    """The request body is not an OTLP trace request; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Reject:
    trace_id: str
    span_id: str
    reason: str
    span_json: str


@dataclass(slots=True)
class DecodedBatch:
    """Rows of the accepted spans plus what the ledger and the reject table need.

    `rows[i]` is span i's values in OTEL_COLUMNS order (one tuple per span: cheaper to build
    than one append per column); `columns[name][i]` is the same value by column name.
    `ledger` holds (row index, handoff_id, row_hash) of each handoff transition; `spans`
    counts every span read, rejected ones included.
    """

    tenant: str
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    ledger: list[tuple[int, str, str]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    spans: int = 0
    flagged: int = 0  # transitions stored with valid=false or a tenant mismatch

    @property
    def stored(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> dict[str, list[Any]]:
        """The rows transposed: OTEL_COLUMNS name -> list of values (a new dict per call)."""
        if not self.rows:
            return {c: [] for c in OTEL_COLUMNS}
        return {c: list(v) for c, v in zip(OTEL_COLUMNS, zip(*self.rows, strict=True), strict=True)}

    def error_message(self) -> str:
        """OTLP partial_success.error_message: the first few reasons, or ''."""
        if not self.rejects:
            return ""
        head = "; ".join(f"span {r.span_id or '?'}: {r.reason}" for r in self.rejects[:5])
        more = len(self.rejects) - 5
        return head + (f"; and {more} more" if more > 0 else "")


# ---------------------------------------------------------------- value encoding


def _fmt_double(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(v)]
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    return repr(v)


def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _pb_plain(av: Any) -> Any:
    """A protobuf AnyValue as the plain Python value (for JSON encoding of arrays/maps)."""
    kind = av.WhichOneof("value")
    if kind == "string_value":
        return av.string_value
    if kind == "int_value":
        return av.int_value
    if kind == "bool_value":
        return av.bool_value
    if kind == "double_value":
        return av.double_value
    if kind == "array_value":
        return [_pb_plain(x) for x in av.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_plain(kv.value) for kv in av.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(av.bytes_value).decode()
    return None


_STRING_WIRE: Final = frozenset(k for k, t in EXPECTED_TAG.items() if t == "string_value")


# protobuf hands out a new str for every key and value of every span; sharing one object per
# distinct key, and per distinct value of the low-cardinality wire attributes, keeps about a
# third of a decoded span's memory off the heap while it waits for the writer. Bounded:
# strings past the limit are used as is (arbitrary keys or values cannot grow the tables).
_SHARED_MAX: Final = 4096
_KEYS: dict[str, str] = {}
_VALUES: dict[str, str] = {}
_LOW_CARDINALITY: Final = frozenset(
    {
        semconv.EVENT,
        semconv.FROM_STATE,
        semconv.TO_STATE,
        semconv.ACTOR,
        semconv.PROTOCOL,
        semconv.MODE,
        semconv.FROM_AGENT,
        semconv.TO_AGENT,
        semconv.TOPOLOGY,
        semconv.ERROR_CODE,
        semconv.RECEIPT_STATUS,
        semconv.GEN_AI_AGENT_NAME,
        semconv.GEN_AI_OPERATION_NAME,
    }
)


def _share(table: dict[str, str], text: str) -> str:
    if len(table) < _SHARED_MAX:
        table[text] = text
    return text


def _pb_attrs(kvs: Any, check: bool) -> tuple[dict[str, str], str | None]:
    """Encode protobuf KeyValues; with `check`, also the first wire-type problem (or None)."""
    out: dict[str, str] = {}
    problem = None
    for kv in kvs:
        key = kv.key
        key = _KEYS.get(key) or _share(_KEYS, key)
        v = kv.value
        s = v.string_value
        if s and (not check or key in _STRING_WIRE or key not in EXPECTED_TAG):
            # fast path: a non-empty string where a string is right
            out[key] = (_VALUES.get(s) or _share(_VALUES, s)) if key in _LOW_CARDINALITY else s
            continue
        w = v.WhichOneof("value")
        items = None
        if w == "string_value":
            pass
        elif w == "int_value":
            s = str(v.int_value)
        elif w == "bool_value":
            s = "true" if v.bool_value else "false"
        elif w == "double_value":
            s = _fmt_double(v.double_value)
        elif w == "array_value":
            items = [_pb_plain(x) for x in v.array_value.values]
            s = _dumps(items)
        elif w == "kvlist_value":
            s = _dumps({x.key: _pb_plain(x.value) for x in v.kvlist_value.values})
        elif w == "bytes_value":
            s = base64.b64encode(v.bytes_value).decode()
        else:
            s = ""
        out[key] = s
        if check and problem is None and key in EXPECTED_TAG:
            want = EXPECTED_TAG[key]
            if w != want or items is not None:
                problem = type_problem(key, w, items)
    return out, problem


# ---------------------------------------------------------------- span assembly

_NO_EVENTS: Final[tuple[list, list, list]] = ([], [], [])
_NO_LINKS: Final[tuple[list, list, list, list]] = ([], [], [], [])


def _finish(
    batch: DecodedBatch,
    res: dict[str, str],
    service: str,
    scope_name: str,
    scope_version: str,
    trace_id: str,
    span_id: str,
    parent_id: str,
    trace_state: str,
    name: str,
    kind: int,
    start: int,
    end: int,
    attrs: dict[str, str],
    problem: str | None,
    status_code: int,
    status_message: str,
    events: tuple[list, list, list],
    links: tuple[list, list, list, list],
    raw: Any,
) -> None:
    batch.spans += 1
    if problem is None:
        if len(trace_id) != 32 or trace_id == _ZERO_TRACE:
            problem = f"traceId must be 16 non-zero bytes, got {trace_id!r}"
        elif len(span_id) != 16 or span_id == _ZERO_SPAN:
            problem = f"spanId must be 8 non-zero bytes, got {span_id!r}"
        elif parent_id and len(parent_id) != 16:
            problem = f"parentSpanId must be 8 bytes or empty, got {parent_id!r}"
        elif start <= 0:
            problem = "startTimeUnixNano is missing or zero"
        elif start >= _MAX_NS or (events[0] and max(events[0]) >= _MAX_NS):
            problem = "a timestamp is past 2262-04-11 (the largest DateTime64(9) value)"
        elif len(attrs) > MAX_ATTRIBUTES:
            problem = f"{len(attrs)} attributes on one span; the limit is {MAX_ATTRIBUTES}"
        elif attrs and max(map(len, attrs.values())) > MAX_VALUE_CHARS:
            problem = f"an attribute value is longer than {MAX_VALUE_CHARS} characters"
    is_handoff = False
    if problem is None:
        result = check_handoff_span(attrs, tenant=batch.tenant)
        problem, is_handoff = result.reject_reason, result.is_handoff
        if result.flags:
            attrs.update(result.flags)
            batch.flagged += 1
    if problem is not None:
        batch.rejects.append(Reject(trace_id, span_id, problem, _span_json_text(raw)))
        return
    rows = batch.rows
    if is_handoff:
        h = span_row_hash(batch.tenant, start, trace_id, span_id, attrs)
        batch.ledger.append((len(rows), attrs["handoff.handoff_id"], h))
    rows.append(
        (  # OTEL_COLUMNS order
            start,
            trace_id,
            span_id,
            parent_id,
            trace_state,
            name,
            _KINDS[kind] if 0 <= kind < 6 else "Unspecified",
            service,
            res,
            scope_name,
            scope_version,
            attrs,
            end - start if end > start else 0,
            _STATUS[status_code] if 0 <= status_code < 3 else "Unset",
            status_message,
            events[0],
            events[1],
            events[2],
            links[0],
            links[1],
            links[2],
            links[3],
        )
    )


_ZERO_TRACE: Final = "0" * 32
_MAX_NS: Final = 2**63  # DateTime64(9) is Int64 nanoseconds
_ZERO_SPAN: Final = "0" * 16


def _span_json_text(raw: Any) -> str:
    try:
        if isinstance(raw, dict):
            text = json.dumps(raw, default=str)
        else:
            from google.protobuf.json_format import MessageToJson

            text = MessageToJson(raw, indent=None)
    except Exception:  # a reject must still be recorded even if its copy fails
        text = ""
    return text[:MAX_SPAN_JSON]


# ---------------------------------------------------------------- protobuf


def decode_protobuf(body: bytes, *, tenant: str) -> DecodedBatch:
    """Decode an OTLP/protobuf ExportTraceServiceRequest. Raises DecodeError on bad framing."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (_PbDecodeError, ValueError, RuntimeError, RecursionError) as exc:
        raise DecodeError(
            f"body is not a valid OTLP ExportTraceServiceRequest protobuf ({len(body)} bytes): {exc}"
        ) from None
    batch = DecodedBatch(tenant=tenant)
    for rs in req.resource_spans:
        res = _pb_attrs(rs.resource.attributes, False)[0]
        service = res.get("service.name", "")
        for ss in rs.scope_spans:
            scope_name, scope_version = ss.scope.name, ss.scope.version
            for sp in ss.spans:
                attrs, problem = _pb_attrs(sp.attributes, True)
                ev = sp.events
                lk = sp.links
                st = sp.status
                _finish(
                    batch,
                    res,
                    service,
                    scope_name,
                    scope_version,
                    sp.trace_id.hex(),
                    sp.span_id.hex(),
                    sp.parent_span_id.hex(),
                    sp.trace_state,
                    sp.name,
                    sp.kind,
                    sp.start_time_unix_nano,
                    sp.end_time_unix_nano,
                    attrs,
                    problem,
                    st.code,
                    st.message,
                    (
                        [e.time_unix_nano for e in ev],
                        [e.name for e in ev],
                        [_pb_attrs(e.attributes, False)[0] for e in ev],
                    )
                    if ev
                    else _NO_EVENTS,
                    (
                        [x.trace_id.hex() for x in lk],
                        [x.span_id.hex() for x in lk],
                        [x.trace_state for x in lk],
                        [_pb_attrs(x.attributes, False)[0] for x in lk],
                    )
                    if lk
                    else _NO_LINKS,
                    sp,
                )
    return batch


# ---------------------------------------------------------------- dispatch

PROTOBUF: Final = "protobuf"
JSON: Final = "json"


def decode_request(body: bytes, fmt: str, *, tenant: str) -> DecodedBatch:
    """Decode `body` in format `fmt` ('protobuf' or 'json'); raises DecodeError."""
    if fmt == PROTOBUF:
        return decode_protobuf(body, tenant=tenant)
    if fmt == JSON:
        from ingest._decode_json import decode_json

        try:
            return decode_json(body, tenant=tenant)
        except RecursionError:
            raise DecodeError("OTLP JSON: nested too deeply") from None
    raise DecodeError(f"unknown OTLP format {fmt!r}")
