"""OTLP trace requests (protobuf or JSON) -> columns of `otel_traces`, validated. Pure.

`decode_protobuf` reads OTLP/protobuf here; `decode_request` dispatches by format to it or
to ingest._decode_json. Both read each span into an ingest._model.SpanParts; values are
encoded by the rules of ingest._wire_rules (as the OpenTelemetry Collector's ClickHouse
exporter does). Ids are lowercase hex, kinds and status codes the exporter's names.

A request whose framing is bad (truncated protobuf, wrong JSON shape) raises DecodeError
(-> HTTP 400). A span that is well framed but breaks the wire contract (a wrong attribute
type, a missing required attribute, a malformed id) is rejected alone: it is listed in
`DecodedBatch.rejects` with the reason and counted in OTLP partial_success.
"""

from __future__ import annotations

import base64
from typing import Any, Final

from google.protobuf.message import DecodeError as _PbDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector import semconv
from ingest._decode_json import decode_json
from ingest._model import (
    JSON,
    NO_EVENTS,
    NO_LINKS,
    OTEL_COLUMNS,
    PROTOBUF,
    DecodedBatch,
    DecodeError,
    Reject,
    SpanParts,
    SpanScope,
    add_span,
)
from ingest._validate import EXPECTED_TAG, type_problem
from ingest._wire_rules import BOOL_TEXT, dumps, fmt_double

__all__ = [
    "JSON",
    "OTEL_COLUMNS",
    "PROTOBUF",
    "DecodeError",
    "DecodedBatch",
    "Reject",
    "decode_protobuf",
    "decode_request",
]


# ---------------------------------------------------------------- value encoding


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
            s = BOOL_TEXT[v.bool_value]
        elif w == "double_value":
            s = fmt_double(v.double_value)
        elif w == "array_value":
            items = [_pb_plain(x) for x in v.array_value.values]
            s = dumps(items)
        elif w == "kvlist_value":
            s = dumps({x.key: _pb_plain(x.value) for x in v.kvlist_value.values})
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
        for ss in rs.scope_spans:
            scope = SpanScope.of(res, ss.scope.name, ss.scope.version)
            for sp in ss.spans:
                attrs, problem = _pb_attrs(sp.attributes, True)
                ev = sp.events
                lk = sp.links
                st = sp.status
                add_span(
                    batch,
                    SpanParts(
                        scope,
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
                        else NO_EVENTS,
                        (
                            [x.trace_id.hex() for x in lk],
                            [x.span_id.hex() for x in lk],
                            [x.trace_state for x in lk],
                            [_pb_attrs(x.attributes, False)[0] for x in lk],
                        )
                        if lk
                        else NO_LINKS,
                        sp,
                    ),
                )
    return batch


# ---------------------------------------------------------------- dispatch


def decode_request(body: bytes, fmt: str, *, tenant: str) -> DecodedBatch:
    """Decode `body` in format `fmt` ('protobuf' or 'json'); raises DecodeError."""
    if fmt == PROTOBUF:
        return decode_protobuf(body, tenant=tenant)
    if fmt == JSON:
        try:
            return decode_json(body, tenant=tenant)
        except RecursionError:
            raise DecodeError("OTLP JSON: nested too deeply") from None
    raise DecodeError(f"unknown OTLP format {fmt!r}")
