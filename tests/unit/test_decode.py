"""OTLP decoding: protobuf and JSON give the same columns, encoded like the Collector exporter."""

from __future__ import annotations

import json

import pytest

from foundation.integrity import row_hash
from ingest import DecodeError, decode_json, decode_protobuf, decode_request
from ingest.testing import request_json, request_protobuf, span_json, transition

T0 = 1_780_000_000_123_456_789
TID = "0af7651916cd43dd8448eb211c80319c"


def _spans():
    create = transition(
        "h-1",
        "create",
        "",
        "created",
        handoff__deadline_ms=30_000,
        handoff__capabilities=["search", "write"],
    )
    commit = transition(
        "h-1",
        "accept",
        "created",
        "accepted",
        handoff__evidence__valid=True,
        handoff__evidence__count=2,
    )
    plain = {"http.method": "GET", "ratio": 0.25, "n": 3, "ok": False, "tags": ["a", 1]}
    return [
        span_json(trace_id=TID, span_id="b7ad6b7169203331", attributes=create, start_ns=T0),
        span_json(
            trace_id=TID,
            span_id="b7ad6b7169203332",
            parent_span_id="b7ad6b7169203331",
            attributes=commit,
            start_ns=T0 + 5,
            end_ns=T0 + 905,
        ),
        span_json(
            trace_id=TID,
            span_id="b7ad6b7169203333",
            attributes=plain,
            start_ns=T0 + 9,
            name="GET /x",
        ),
    ]


def test_protobuf_and_json_decode_to_the_same_columns():
    spans = _spans()
    a = decode_protobuf(request_protobuf(spans, service="svc-a"), tenant="acme")
    b = decode_json(json.dumps(request_json(spans, service="svc-a")).encode(), tenant="acme")
    assert a.columns == b.columns
    assert a.ledger == b.ledger
    assert (a.spans, a.stored, len(a.rejects)) == (3, 3, 0)


def test_values_are_encoded_like_the_collector_exporter():
    b = decode_request(request_protobuf(_spans()), "protobuf", tenant="t")
    attrs = b.columns["SpanAttributes"]
    assert attrs[0]["handoff.deadline_ms"] == "30000"
    assert attrs[0]["handoff.capabilities"] == '["search","write"]'
    assert attrs[1]["handoff.evidence.valid"] == "true"
    assert attrs[2] == {
        "http.method": "GET",
        "ratio": "0.25",
        "n": "3",
        "ok": "false",
        "tags": '["a",1]',
    }
    assert b.columns["TraceId"][0] == TID
    assert b.columns["ParentSpanId"][1] == "b7ad6b7169203331"
    assert b.columns["Timestamp"][1] == T0 + 5
    assert b.columns["Duration"][1] == 900
    assert b.columns["SpanKind"][0] == "Internal"
    assert b.columns["StatusCode"][0] == "Unset"
    assert b.columns["ServiceName"][0] == "test-agent"
    assert b.columns["ResourceAttributes"][0] == {"service.name": "test-agent"}


def test_ledger_holds_the_row_hash_of_each_transition_only():
    b = decode_request(request_protobuf(_spans()), "protobuf", tenant="acme")
    assert [i for i, _, _ in b.ledger] == [0, 1]  # the plain span is not a transition
    idx, handoff_id, h = b.ledger[1]
    attrs = b.columns["SpanAttributes"][idx]
    assert handoff_id == "h-1"
    assert h == row_hash(
        {
            "tenant": "acme",
            "time_ns": T0 + 5,
            "trace_id": TID,
            "span_id": "b7ad6b7169203332",
            "task_id": "task-1",
            "handoff_id": "h-1",
            "event": "accept",
            "from_state": "created",
            "to_state": "accepted",
            "actor": "agent-b",
            "attributes": attrs,
        }
    )


def test_truncated_protobuf_is_a_decode_error():
    body = request_protobuf(_spans())
    with pytest.raises(DecodeError, match="not a valid OTLP ExportTraceServiceRequest protobuf"):
        decode_protobuf(body[: len(body) - 7], tenant="t")


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"resourceSpans": {"not": "a list"}}, r"\$\.resourceSpans: expected an array"),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": ["x"]}]}]},
            r"spans\[0\]: expected an object",
        ),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 7}]}]}]},
            r"spans\[0\]\.traceId: expected a hex string",
        ),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]},
            r"startTimeUnixNano: expected an integer",
        ),
        ([1, 2], r"\$: expected an object"),
    ],
)
def test_wrong_json_shape_names_the_path(doc, where):
    with pytest.raises(DecodeError, match=where):
        decode_json(json.dumps(doc).encode(), tenant="t")


def test_not_json_at_all():
    with pytest.raises(DecodeError, match="not valid JSON"):
        decode_json(b"\x00\x01garbage", tenant="t")


def test_bad_ids_reject_the_span_not_the_request():
    spans = _spans()
    spans[2]["spanId"] = "00"
    b = decode_json(json.dumps(request_json(spans)).encode(), tenant="t")
    assert (b.spans, b.stored, len(b.rejects)) == (3, 2, 1)
    assert "spanId must be 8 non-zero bytes" in b.rejects[0].reason
    assert json.loads(b.rejects[0].span_json)["name"] == "GET /x"


def test_empty_request_is_fine():
    b = decode_json(b"{}", tenant="t")
    assert (b.spans, b.stored) == (0, 0)


def test_row_hash_matches_integrity_on_awkward_strings():
    attrs = transition('h-"q"', "create", "", "created", actor="agent \u00e9\n\t\u2028\x01")
    attrs["z.emoji"] = "\U0001f600 / \\ back"
    attrs["a.empty"] = ""
    b = decode_json(
        json.dumps(
            request_json(
                [span_json(trace_id=TID, span_id="b7ad6b7169203331", attributes=attrs, start_ns=T0)]
            )
        ),
        tenant="t\u00fcnant",
    )
    ((_idx, _hid, h),) = b.ledger
    stored = b.columns["SpanAttributes"][0]
    assert h == row_hash(
        {
            "tenant": "t\u00fcnant",
            "time_ns": T0,
            "trace_id": TID,
            "span_id": "b7ad6b7169203331",
            "task_id": "task-1",
            "handoff_id": 'h-"q"',
            "event": "create",
            "from_state": "",
            "to_state": "created",
            "actor": "agent \u00e9\n\t\u2028\x01",
            "attributes": stored,
        }
    )


def test_lone_surrogate_is_a_decode_error_but_pairs_are_fine():
    lone = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"\\ud800x"}]}]}]}'
    with pytest.raises(DecodeError, match="lone UTF-16 surrogate"):
        decode_json(lone, tenant="t")
    spans = _spans()
    spans[2]["name"] = "\U0001f600"
    assert (
        decode_json(json.dumps(request_json(spans)).encode(), tenant="t").columns["SpanName"][2]
        == "\U0001f600"
    )


def test_timestamp_past_datetime64_range_rejects_the_span():
    spans = _spans()
    spans[0]["startTimeUnixNano"] = str(2**64 - 1)
    b = decode_json(json.dumps(request_json(spans)).encode(), tenant="t")
    assert (b.stored, len(b.rejects)) == (2, 1)
    assert "past 2262-04-11" in b.rejects[0].reason


def test_deep_nesting_is_a_decode_error_not_a_crash():
    deep_doc = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_request(deep_doc, "json", tenant="t")
    value = '{"arrayValue":{"values":[' * 3000 + "]}}" * 3000
    attrs = f'[{{"key":"a","value":{value}}}]'
    doc = '{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":' + attrs + "}]}]}]}"
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_request(doc.encode(), "json", tenant="t")


def test_too_many_attributes_or_too_long_a_value_rejects_the_span():
    from ingest._wire_rules import MAX_ATTRIBUTES, MAX_VALUE_CHARS

    spans = _spans()
    spans[2]["attributes"] = [
        {"key": f"k{i}", "value": {"stringValue": "x"}} for i in range(MAX_ATTRIBUTES + 1)
    ]
    spans[1]["attributes"].append(
        {"key": "big", "value": {"stringValue": "v" * (MAX_VALUE_CHARS + 1)}}
    )
    b = decode_json(json.dumps(request_json(spans)).encode(), tenant="t")
    reasons = sorted(r.reason for r in b.rejects)
    assert b.stored == 1 and len(reasons) == 2
    assert reasons[0].startswith(f"{MAX_ATTRIBUTES + 1} attributes on one span")
    assert "longer than" in reasons[1]


def _resource_claim(span_claim: str | None, resource_claim: str) -> dict:
    attrs = transition("h-9", "create", "", "created")
    attrs.pop("handoff.tenant", None)
    if span_claim is not None:
        attrs["handoff.tenant"] = span_claim
    doc = request_json(
        [span_json(trace_id=TID, span_id="c7ad6b7169203331", attributes=attrs, start_ns=T0)]
    )
    doc["resourceSpans"][0]["resource"]["attributes"].append(
        {"key": "handoff.tenant", "value": {"stringValue": resource_claim}}
    )
    return doc


def _decoded_both(doc: dict, tenant: str):
    """The same request through the JSON and the protobuf decoder."""
    import base64
    import copy

    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    pb_doc = copy.deepcopy(doc)
    for rs in pb_doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
    body = ParseDict(pb_doc, ExportTraceServiceRequest()).SerializeToString()
    return decode_json(json.dumps(doc).encode(), tenant=tenant), decode_protobuf(
        body, tenant=tenant
    )


def test_a_tenant_claimed_on_the_resource_only_is_recorded_and_checked():
    for batch in _decoded_both(_resource_claim(None, "other"), tenant="acme"):
        (attrs,) = batch.columns["SpanAttributes"]
        assert attrs["handoff.tenant"] == "other"
        assert attrs["handoff.tenant_mismatch"] == "true"
        assert batch.flagged == 1
    for batch in _decoded_both(_resource_claim(None, "acme"), tenant="acme"):
        (attrs,) = batch.columns["SpanAttributes"]
        assert attrs["handoff.tenant"] == "acme"
        assert "handoff.tenant_mismatch" not in attrs
        assert batch.flagged == 0


def test_the_span_claim_wins_over_the_resource_claim():
    for batch in _decoded_both(_resource_claim("acme", "other"), tenant="acme"):
        (attrs,) = batch.columns["SpanAttributes"]
        assert attrs["handoff.tenant"] == "acme"
        assert "handoff.tenant_mismatch" not in attrs
    for batch in _decoded_both(_resource_claim("other", "acme"), tenant="acme"):
        (attrs,) = batch.columns["SpanAttributes"]
        assert attrs["handoff.tenant"] == "other"
        assert attrs["handoff.tenant_mismatch"] == "true"
