"""OTLP/JSON trace requests -> the same columns as the protobuf decoder. Pure.

OTLP's JSON mapping: ids in hex (not base64), int64 as number or decimal string, enums as
numbers or names, `scopeSpans` (or the older `instrumentationLibrarySpans`). A wrong shape
(an id that is not a string, too) raises DecodeError naming the JSON path; an id that is a
string but not hex rejects its span alone, as a wrong-length id does.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Final

from ingest._model import DecodedBatch, DecodeError, SpanParts, SpanScope, add_span
from ingest._validate import EXPECTED_TAG, type_problem
from ingest._wire_rules import BOOL_TEXT, KIND_IDS, STATUS_IDS, dumps, fmt_double

__all__ = ["decode_json"]

_SURROGATE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


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


def _jid(v: Any, path: str, name: str) -> tuple[str, str | None]:
    """(lowercase hex, None) of an OTLP/JSON id, or ("", why) for a string that is not hex
    (the span is rejected); DecodeError for a value that is not a string at all."""
    if v is None or v == "":
        return "", None
    if not isinstance(v, str):
        raise _jerr(path, f"expected a hex string, got {type(v).__name__}")
    try:
        bytes.fromhex(v)
    except ValueError:
        return "", f"{name} must be a hex string, got {v[:64]!r}"
    return v.lower(), None


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
        return BOOL_TEXT[v]
    if tag == "double_value":
        return fmt_double(v)
    if tag in ("array_value", "kvlist_value"):
        return dumps(v)
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
    if isinstance(v, str) and v in KIND_IDS:
        return KIND_IDS[v]
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
        except RecursionError:
            raise DecodeError("OTLP JSON: nested too deeply") from None
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
        scope_key = "scopeSpans" if "scopeSpans" in rs else "instrumentationLibrarySpans"
        for si, ss in enumerate(_jlist(rs, scope_key, rp)):
            sp_path = f"{rp}.{scope_key}[{si}]"
            ss = _jobj(ss, sp_path)
            sc = _jobj(
                ss.get("scope") or ss.get("instrumentationLibrary") or {}, f"{sp_path}.scope"
            )
            scope = SpanScope.of(res, str(sc.get("name", "")), str(sc.get("version", "")))
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
                trace_id, bad_t = _jid(sp.get("traceId"), f"{p}.traceId", "traceId")
                span_id, bad_s = _jid(sp.get("spanId"), f"{p}.spanId", "spanId")
                parent_id, bad_p = _jid(sp.get("parentSpanId"), f"{p}.parentSpanId", "parentSpanId")
                bad_ids = [bad_t, bad_s, bad_p]
                lk_t, lk_s, lk_ts, lk_a = [], [], [], []
                for li, x in enumerate(lks):
                    x = _jobj(x, f"{p}.links[{li}]")
                    lp = f"links[{li}]"
                    lt, bad_lt = _jid(x.get("traceId"), f"{p}.{lp}.traceId", f"{lp}.traceId")
                    ls, bad_ls = _jid(x.get("spanId"), f"{p}.{lp}.spanId", f"{lp}.spanId")
                    lk_t.append(lt)
                    lk_s.append(ls)
                    bad_ids += (bad_lt, bad_ls)
                    lk_ts.append(str(x.get("traceState", "")))
                    lk_a.append(_jattrs(x.get("attributes"), f"{p}.links[{li}].attributes")[0])
                status = _jobj(sp.get("status") or {}, f"{p}.status")
                code = status.get("code", 0)
                code = STATUS_IDS.get(code, code) if isinstance(code, str) else code
                name = sp.get("name", "")
                if not isinstance(name, str):
                    raise _jerr(f"{p}.name", "expected a string")
                if problem is None:  # a malformed id rejects the span, as in ingest._decode
                    problem = next((bad for bad in bad_ids if bad is not None), None)
                add_span(
                    batch,
                    SpanParts(
                        scope,
                        trace_id,
                        span_id,
                        parent_id,
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
                    ),
                )
    return batch
