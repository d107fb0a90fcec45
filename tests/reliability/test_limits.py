"""Limits of the OTLP endpoint: pathological bodies, the size rules, stalled clients.

Pathological bodies (deep nesting, invalid UTF-8, NaN, empty) must get a 4xx with a reason
or a 200, never a 500. Size rules serve implements: the body limit (--max-body-bytes, after
gunzip: 413 naming the limit) and the per-span rule (> 1024 attributes or a value over 1 Mi
characters: the span is rejected in partial_success, never truncated).
"""

from __future__ import annotations

import time

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.reliability._helpers import ACME, JS, PB, explains

LIMIT = 4 * 1024 * 1024  # limits_serve's --max-body-bytes


@pytest.fixture(scope="module")
def limits_serve(tmp_path_factory):
    from serve.testing import start_serve

    h = start_serve(
        tmp_path_factory.mktemp("limits"),
        "tok-acme=acme",
        extra_args=("--max-body-bytes", str(LIMIT)),
    )
    yield h
    assert h.stop() == 0, h.log()[-2000:]


# ------------------------------------------------------------------ pathological bodies


def _deep_json_value(depth: int) -> str:
    inner = '{"stringValue":"x"}'
    for _ in range(depth):
        inner = '{"arrayValue":{"values":[' + inner + "]}}"
    return inner


def _deep_pb_request(depth: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.start_time_unix_nano = b"\1" * 16, b"\1" * 8, time.time_ns()
    v = sp.attributes.add()
    v.key = "deep"
    val = v.value
    for _ in range(depth):
        val = val.array_value.values.add()
    val.string_value = "x"
    return req.SerializeToString()


@pytest.mark.parametrize(
    ("name", "body", "ctype"),
    [
        pytest.param("json nested 100k deep", b"[" * 100_000 + b"]" * 100_000, JS),
        pytest.param(
            "json AnyValue nested 3000 deep",
            (
                '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"'
                + "1" * 32
                + '","spanId":"'
                + "1" * 16
                + '","startTimeUnixNano":"1","attributes":'
                + '[{"key":"deep","value":'
                + _deep_json_value(3000)
                + "}]}]}]}]}"
            ).encode(),
            JS,
        ),
        ("protobuf AnyValue nested 200 deep", _deep_pb_request(200), PB),
        ("json invalid utf-8", b'{"resourceSpans": "\xff\xfe"}', JS),
        ("json NaN token", b'{"resourceSpans": NaN}', JS),
        ("empty json", b"", JS),
        ("empty protobuf", b"", PB),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_pathological_bodies_get_a_4xx_or_200_never_a_500(limits_serve, name, body, ctype):
    r = requests.post(
        f"{limits_serve.otlp_url}/v1/traces", data=body, headers={**ctype, **ACME}, timeout=60
    )
    fmt = "protobuf" if ctype is PB else "json"
    assert r.status_code in (200, 400), (name, r.status_code, r.text[:300])
    if r.status_code == 400:
        explains(r, fmt)


# ------------------------------------------------------------------ size rule


def _one_span(span_id: str, attrs: dict[str, str]) -> bytes:
    """One span with string attributes `attrs`, built with the protobuf API (fast for 100k+)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id = b"\x5a" * 16, bytes.fromhex(span_id)
    sp.start_time_unix_nano = sp.end_time_unix_nano = time.time_ns()
    for k, v in attrs.items():
        kv = sp.attributes.add()
        kv.key = k
        kv.value.string_value = v
    return req.SerializeToString()


def _stored_sizes(h, span_id: str) -> tuple[int, int] | None:
    c = h.client()
    try:
        rows = c.query(
            "SELECT length(SpanAttributes['big']), length(mapKeys(SpanAttributes)) "
            "FROM otel_traces WHERE SpanId = {s:String}",
            parameters={"s": span_id},
        ).result_rows
    finally:
        c.close()
    return rows[0] if rows else None


def test_size_rule_is_the_body_limit(limits_serve):
    """Serve's only size rule: a body over --max-body-bytes (after gunzip) is refused whole,
    413 naming the limit; one huge value or a huge attribute count are refused by it alone."""
    h = limits_serve
    huge_value = _one_span("00000000000000b1", {"big": "v" * (LIMIT + 1)})
    many = _one_span("00000000000000b2", {f"a{i}": "x" for i in range(LIMIT // 10)})
    for body in (huge_value, many):
        assert len(body) > LIMIT
        r = requests.post(f"{h.otlp_url}/v1/traces", data=body, headers={**PB, **ACME}, timeout=60)
        assert r.status_code == 413
        assert f"exceeds the limit of {LIMIT} bytes" in explains(r, "protobuf")
    under = _one_span("00000000000000b3", {"big": "v" * 1_000_000})
    r = requests.post(f"{h.otlp_url}/v1/traces", data=under, headers={**PB, **ACME}, timeout=60)
    assert r.status_code == 200
    h.wait_stored(60)
    assert _stored_sizes(h, "00000000000000b3") == (1_000_000, 1)  # stored whole, not cut


def _post_one(h, span_id: str, attrs: dict[str, str]) -> ExportTraceServiceResponse:
    r = requests.post(
        f"{h.otlp_url}/v1/traces",
        data=_one_span(span_id, attrs),
        headers={**PB, **ACME},
        timeout=60,
    )
    assert r.status_code == 200, r.text[:300]
    return ExportTraceServiceResponse.FromString(r.content)


def test_per_span_rule_rejects_too_many_attributes_or_too_long_values(limits_serve):
    """Serve's per-span rule (ingest/_decode.py): more than 1024 attributes, or a value longer
    than 1 Mi (1,048,576) characters, and the span is rejected whole in partial_success with
    the reason; never truncated, so what is stored is what was sent. At the limit: stored."""
    h = limits_serve
    cases = {
        "00000000000000c1": ({f"k{i}": "x" for i in range(1024)}, 0),
        "00000000000000c2": ({f"k{i}": "x" for i in range(1025)}, 1),
        "00000000000000c3": ({"big": "v" * (1 << 20)}, 0),
        "00000000000000c4": ({"big": "v" * ((1 << 20) + 1)}, 1),
        "00000000000000c5": ({f"k{i}": "x" for i in range(100_000)}, 1),
    }
    reasons = {}
    for sid, (attrs, rejected) in cases.items():
        resp = _post_one(h, sid, attrs)
        assert resp.partial_success.rejected_spans == rejected, sid
        reasons[sid] = resp.partial_success.error_message
    assert "the limit is 1024" in reasons["00000000000000c2"]
    assert "longer than 1048576 characters" in reasons["00000000000000c4"]
    h.wait_stored(60)
    assert _stored_sizes(h, "00000000000000c1") == (0, 1024)
    assert _stored_sizes(h, "00000000000000c3") == (1 << 20, 1)
    for sid in ("00000000000000c2", "00000000000000c4", "00000000000000c5"):
        assert _stored_sizes(h, sid) is None
    print(f"FIGURES per_span_rule: {len(cases)} cases; rejected at 1025 attrs and 1 Mi + 1 chars")


def test_stalled_clients_do_not_block_others(limits_serve):
    """50 connections that promise a body and stall (slowloris) do not stop a normal client
    (each connection has its own thread, closed by serve after its idle timeout)."""
    import socket

    h = limits_serve
    stalled = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", h.otlp_port), timeout=10)
            s.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer tok-acme\r\nContent-Length: 100000\r\n\r\n{"
            )
            stalled.append(s)
        r = requests.post(f"{h.otlp_url}/v1/traces", data=b"{}", headers={**JS, **ACME}, timeout=30)
        assert r.status_code == 200
        assert h.health()["status"] == "ok"
    finally:
        for s in stalled:
            s.close()
