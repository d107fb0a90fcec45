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
import hashlib
import json
import re
from dataclasses import dataclass, field
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

from google.protobuf.message import DecodeError as _PbDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ingest._validate import EXPECTED_TAG, check_handoff_span, type_problem

__all__ = [
    "OTEL_COLUMNS",
    "DecodeError",
    "DecodedBatch",
    "Reject",
    "decode_json",
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
    """Columns of the accepted spans plus what the ledger and the reject table need.

    `columns[name][i]` is span i's value; `ledger` holds (row index, handoff_id, row_hash)
    of each handoff transition; `spans` counts every span read, rejected ones included.
    """

    tenant: str
    columns: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in OTEL_COLUMNS})
    ledger: list[tuple[int, str, str]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    spans: int = 0
    flagged: int = 0  # transitions stored with valid=false or a tenant mismatch

    @property
    def stored(self) -> int:
        return len(self.columns["SpanId"])

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


def _pb_attrs(kvs: Any, check: bool) -> tuple[dict[str, str], str | None]:
    """Encode protobuf KeyValues; with `check`, also the first wire-type problem (or None)."""
    out: dict[str, str] = {}
    problem = None
    for kv in kvs:
        key = kv.key
        v = kv.value
        w = v.WhichOneof("value")
        items = None
        if w == "string_value":
            s = v.string_value
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

_E = encode_basestring  # json's C string escaper, as json.dumps(ensure_ascii=False) uses
_NO_EVENTS: Final[tuple[list, list, list]] = ([], [], [])
_NO_LINKS: Final[tuple[list, list, list, list]] = ([], [], [], [])


def _fast_row_hash(
    tenant: str, start: int, trace_id: str, span_id: str, attrs: dict[str, str]
) -> str:
    """ingest.integrity.row_hash of a decoded span, its canonical JSON spelled out directly.

    Byte-identical to integrity.canonical_json (sorted keys, no spaces, UTF-8 kept; json's own
    string escaper); tests/unit/test_decode.py checks equality on awkward strings.
    """
    g = attrs.get
    body = ",".join([_E(k) + ":" + _E(v) for k, v in sorted(attrs.items())])
    text = (
        '{"actor":' + _E(g("handoff.actor", ""))
        + ',"attributes":{' + body
        + '},"event":' + _E(g("handoff.event", ""))
        + ',"from_state":' + _E(g("handoff.from_state", ""))
        + ',"handoff_id":' + _E(attrs["handoff.handoff_id"])
        + ',"span_id":' + _E(span_id)
        + ',"task_id":' + _E(g("handoff.task_id", ""))
        + ',"tenant":' + _E(tenant)
        + ',"time_ns":' + str(start)
        + ',"to_state":' + _E(g("handoff.to_state", ""))
        + ',"trace_id":' + _E(trace_id)
        + "}"
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


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
    cols = batch.columns
    idx = len(cols["SpanId"])
    cols["Timestamp"].append(start)
    cols["TraceId"].append(trace_id)
    cols["SpanId"].append(span_id)
    cols["ParentSpanId"].append(parent_id)
    cols["TraceState"].append(trace_state)
    cols["SpanName"].append(name)
    cols["SpanKind"].append(_KINDS[kind] if 0 <= kind < 6 else "Unspecified")
    cols["ServiceName"].append(service)
    cols["ResourceAttributes"].append(res)
    cols["ScopeName"].append(scope_name)
    cols["ScopeVersion"].append(scope_version)
    cols["SpanAttributes"].append(attrs)
    cols["Duration"].append(end - start if end > start else 0)
    cols["StatusCode"].append(_STATUS[status_code] if 0 <= status_code < 3 else "Unset")
    cols["StatusMessage"].append(status_message)
    cols["Events.Timestamp"].append(events[0])
    cols["Events.Name"].append(events[1])
    cols["Events.Attributes"].append(events[2])
    cols["Links.TraceId"].append(links[0])
    cols["Links.SpanId"].append(links[1])
    cols["Links.TraceState"].append(links[2])
    cols["Links.Attributes"].append(links[3])
    if is_handoff:
        h = _fast_row_hash(batch.tenant, start, trace_id, span_id, attrs)
        batch.ledger.append((idx, attrs["handoff.handoff_id"], h))


_ZERO_TRACE: Final = "0" * 32
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
    except (_PbDecodeError, ValueError, RuntimeError) as exc:
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


# ---------------------------------------------------------------- JSON


def _jerr(path: str, what: str) -> DecodeError:
    return DecodeError(f"OTLP JSON: {path}: {what}")


def _jlist(obj: dict, key: str, path: str) -> list:
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise _jerr(f"{path}.{key}", f"expected an array, got {type(v).__name__}")
    return v


def _jobj(v: Any, path: str) -> dict:
    if not isinstance(v, dict):
        raise _jerr(path, f"expected an object, got {type(v).__name__}")
    return v


def _jint(v: Any, path: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise _jerr(path, f"expected an integer (number or decimal string), got {v!r}")
    try:
        return int(v)
    except ValueError:
        raise _jerr(path, f"expected an integer (number or decimal string), got {v!r}") from None


def _jhex(v: Any, path: str) -> str:
    if v is None or v == "":
        return ""
    if not isinstance(v, str):
        raise _jerr(path, f"expected a hex string, got {type(v).__name__}")
    try:
        bytes.fromhex(v)
    except ValueError:
        raise _jerr(path, f"expected a hex string, got {v!r}") from None
    return v.lower()


def _jplain(av: Any, path: str) -> Any:
    return _jvalue(av, path)[1]


def _jvalue(av: Any, path: str) -> tuple[str | None, Any]:
    """(AnyValue field name, plain value) of an OTLP/JSON AnyValue."""
    if av is None:
        return None, None
    av = _jobj(av, path)
    if "stringValue" in av:
        v = av["stringValue"]
        if not isinstance(v, str):
            raise _jerr(path, "stringValue must be a string")
        return "string_value", v
    if "intValue" in av:
        return "int_value", _jint(av["intValue"], f"{path}.intValue")
    if "boolValue" in av:
        if not isinstance(av["boolValue"], bool):
            raise _jerr(path, "boolValue must be true or false")
        return "bool_value", av["boolValue"]
    if "doubleValue" in av:
        v = av["doubleValue"]
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise _jerr(path, "doubleValue must be a number")
        try:
            return "double_value", float(v)
        except ValueError:
            raise _jerr(path, f"doubleValue must be a number, got {v!r}") from None
    if "arrayValue" in av:
        vals = _jlist(_jobj(av["arrayValue"], f"{path}.arrayValue"), "values", f"{path}.arrayValue")
        return "array_value", [
            _jplain(x, f"{path}.arrayValue.values[{i}]") for i, x in enumerate(vals)
        ]
    if "kvlistValue" in av:
        vals = _jlist(
            _jobj(av["kvlistValue"], f"{path}.kvlistValue"), "values", f"{path}.kvlistValue"
        )
        out = {}
        for i, kv in enumerate(vals):
            kv = _jobj(kv, f"{path}.kvlistValue.values[{i}]")
            out[str(kv.get("key", ""))] = _jplain(
                kv.get("value"), f"{path}.kvlistValue.values[{i}].value"
            )
        return "kvlist_value", out
    if "bytesValue" in av:
        try:
            raw = base64.b64decode(av["bytesValue"], validate=True)
        except Exception:
            raise _jerr(path, "bytesValue must be base64") from None
        return "bytes_value", base64.b64encode(raw).decode()
    return None, None


def _jencode(tag: str | None, v: Any) -> str:
    if tag == "string_value" or tag == "bytes_value":
        return v
    if tag == "int_value":
        return str(v)
    if tag == "bool_value":
        return "true" if v else "false"
    if tag == "double_value":
        return _fmt_double(v)
    if tag in ("array_value", "kvlist_value"):
        return _dumps(v)
    return ""


def _jattrs(kvs: Any, path: str, check: bool = False) -> tuple[dict[str, str], str | None]:
    if kvs is None:
        return {}, None
    if not isinstance(kvs, list):
        raise _jerr(path, f"expected an array of {{key, value}}, got {type(kvs).__name__}")
    enc: dict[str, str] = {}
    problem = None
    for i, kv in enumerate(kvs):
        kv = _jobj(kv, f"{path}[{i}]")
        key = kv.get("key")
        if not isinstance(key, str):
            raise _jerr(f"{path}[{i}].key", "expected a string")
        tag, v = _jvalue(kv.get("value"), f"{path}[{i}].value")
        enc[key] = _jencode(tag, v)
        if check and problem is None and key in EXPECTED_TAG:
            problem = type_problem(key, tag, v if tag == "array_value" else None)
    return enc, problem


def _jkind(v: Any, path: str) -> int:
    if isinstance(v, str) and v in _KIND_NAMES:
        return _KIND_NAMES[v]
    return _jint(v, path)


def decode_json(body: bytes | str | dict, *, tenant: str) -> DecodedBatch:
    """Decode an OTLP/JSON ExportTraceServiceRequest (ids in hex, per the OTLP JSON mapping).

    Raises DecodeError naming the JSON path that has the wrong shape.
    """
    if isinstance(body, dict):
        doc = body
    else:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from None
    doc = _jobj(doc, "$")
    if isinstance(body, (bytes, str)) and _SURROGATE.search(
        body if isinstance(body, bytes) else body.encode()
    ):
        try:  # escaped surrogates are fine in pairs; a lone one cannot be stored as UTF-8
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DecodeError(
                "OTLP JSON: a string holds a lone UTF-16 surrogate (\\uD800-\\uDFFF)"
            ) from None
    batch = DecodedBatch(tenant=tenant)
    for ri, rs in enumerate(_jlist(doc, "resourceSpans", "$")):
        rp = f"resourceSpans[{ri}]"
        rs = _jobj(rs, rp)
        resource = _jobj(rs.get("resource") or {}, f"{rp}.resource")
        res, _ = _jattrs(resource.get("attributes"), f"{rp}.resource.attributes")
        service = res.get("service.name", "")
        scope_key = "scopeSpans" if "scopeSpans" in rs else "instrumentationLibrarySpans"
        for si, ss in enumerate(_jlist(rs, scope_key, rp)):
            sp_path = f"{rp}.{scope_key}[{si}]"
            ss = _jobj(ss, sp_path)
            sc = _jobj(
                ss.get("scope") or ss.get("instrumentationLibrary") or {}, f"{sp_path}.scope"
            )
            scope = (str(sc.get("name", "")), str(sc.get("version", "")))
            for pi, sp in enumerate(_jlist(ss, "spans", sp_path)):
                p = f"{sp_path}.spans[{pi}]"
                sp = _jobj(sp, p)
                attrs, problem = _jattrs(sp.get("attributes"), f"{p}.attributes", True)
                evs = _jlist(sp, "events", p)
                lks = _jlist(sp, "links", p)
                ev_ts, ev_names, ev_attrs = [], [], []
                for ei, e in enumerate(evs):
                    e = _jobj(e, f"{p}.events[{ei}]")
                    ev_ts.append(_jint(e.get("timeUnixNano"), f"{p}.events[{ei}].timeUnixNano"))
                    ev_names.append(str(e.get("name", "")))
                    ev_attrs.append(_jattrs(e.get("attributes"), f"{p}.events[{ei}].attributes")[0])
                lk_t, lk_s, lk_ts, lk_a = [], [], [], []
                for li, x in enumerate(lks):
                    x = _jobj(x, f"{p}.links[{li}]")
                    lk_t.append(_jhex(x.get("traceId"), f"{p}.links[{li}].traceId"))
                    lk_s.append(_jhex(x.get("spanId"), f"{p}.links[{li}].spanId"))
                    lk_ts.append(str(x.get("traceState", "")))
                    lk_a.append(_jattrs(x.get("attributes"), f"{p}.links[{li}].attributes")[0])
                status = _jobj(sp.get("status") or {}, f"{p}.status")
                code = status.get("code", 0)
                code = _STATUS_NAMES.get(code, code) if isinstance(code, str) else code
                name = sp.get("name", "")
                if not isinstance(name, str):
                    raise _jerr(f"{p}.name", "expected a string")
                _finish(
                    batch,
                    res,
                    service,
                    scope[0],
                    scope[1],
                    _jhex(sp.get("traceId"), f"{p}.traceId"),
                    _jhex(sp.get("spanId"), f"{p}.spanId"),
                    _jhex(sp.get("parentSpanId"), f"{p}.parentSpanId"),
                    str(sp.get("traceState", "")),
                    name,
                    _jkind(sp.get("kind", 0), f"{p}.kind"),
                    _jint(sp.get("startTimeUnixNano"), f"{p}.startTimeUnixNano"),
                    _jint(sp.get("endTimeUnixNano"), f"{p}.endTimeUnixNano"),
                    attrs,
                    problem,
                    _jint(code, f"{p}.status.code"),
                    str(status.get("message", "")),
                    (ev_ts, ev_names, ev_attrs),
                    (lk_t, lk_s, lk_ts, lk_a),
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
        return decode_json(body, tenant=tenant)
    raise DecodeError(f"unknown OTLP format {fmt!r}")
