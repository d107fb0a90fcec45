"""Every refused export request is visible to an operator: the status the client gets, a
log line in serve's output (with reason, client address, user agent and a credential label,
never the token), and the counter on `GET /metrics` that moved — over HTTP and gRPC, against
a real serve, scraped and parsed with prometheus-client's own parser."""

from __future__ import annotations

import gzip
import socket

import grpc
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve

TOKENS = "tok-acme=acme"
SECRET = "wrong-secret-4711"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PB = {"Content-Type": "application/x-protobuf", "User-Agent": "refusal-probe/1.0"}


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(
        tmp_path_factory.mktemp("refusals"), TOKENS, extra_args=("--max-body-bytes", "65536")
    )
    yield h
    assert h.stop() == 0, h.log()


def _metrics(h) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = requests.get(f"{h.otlp_url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def _refused(m, transport: str, status: str, reason: str) -> float:
    key = (
        "handoffs_receiver_refused_requests_total",
        (("reason", reason), ("status", status), ("transport", transport)),
    )
    return m.get(key, 0.0)


def _body(span_id: str = "cd" * 8) -> bytes:
    span = span_json(
        trace_id="ab" * 16,
        span_id=span_id,
        attributes=transition("r1", "create", "", "created"),
        start_ns=1_790_000_000_000_000_000,
    )
    return request_protobuf([span])


def _raw(h, head: bytes) -> bytes:
    port = int(h.otlp_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


HTTP_CASES = [
    ("401", "missing_token", lambda h: requests.post(f"{h.otlp_url}/v1/traces", data=_body(), headers=PB)),
    ("401", "unknown_token", lambda h: requests.post(
        f"{h.otlp_url}/v1/traces", data=_body(), headers={**PB, "Authorization": f"Bearer {SECRET}"})),
    ("413", "too_large", lambda h: requests.post(
        f"{h.otlp_url}/v1/traces", data=b"\x0a" * 70000, headers={**PB, "Authorization": "Bearer tok-acme"})),
    ("413", "too_large", lambda h: requests.post(
        f"{h.otlp_url}/v1/traces", data=gzip.compress(b"\x00" * 200000),
        headers={**PB, "Authorization": "Bearer tok-acme", "Content-Encoding": "gzip"})),
    ("415", "unsupported_content_type", lambda h: requests.post(
        f"{h.otlp_url}/v1/traces", data=b"x", headers={"Content-Type": "text/plain", "User-Agent": "refusal-probe/1.0", "Authorization": "Bearer tok-acme"})),
    ("400", "undecodable", lambda h: requests.post(
        f"{h.otlp_url}/v1/traces", data=b"\xff\xff\xff", headers={**PB, "Authorization": "Bearer tok-acme"})),
    ("405", "method_not_allowed", lambda h: requests.get(f"{h.otlp_url}/v1/traces", headers=PB)),
    ("404", "not_found", lambda h: requests.post(f"{h.otlp_url}/v2/traces", data=b"", headers=PB)),
]  # fmt: skip


@pytest.mark.parametrize(("status", "reason", "send"), HTTP_CASES)
def test_http_refusal_is_answered_logged_and_counted(serve, status, reason, send):
    before = _refused(_metrics(serve), "http", status, reason)
    r = send(serve)
    assert r.status_code == int(status), r.text
    after = _metrics(serve)
    assert _refused(after, "http", status, reason) == before + 1
    log = serve.log()
    assert f"refused http {status} ({reason}) from 127.0.0.1:" in log
    assert SECRET not in log


def test_bad_framing_and_missing_length_are_counted(serve):
    m0 = _metrics(serve)
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    assert _raw(serve, head + b"Content-Length: -1\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw(serve, head + b"Authorization: Bearer tok-acme\r\n\r\n").startswith(b"HTTP/1.1 411")
    m1 = _metrics(serve)
    assert (
        _refused(m1, "http", "400", "bad_framing") == _refused(m0, "http", "400", "bad_framing") + 1
    )
    assert (
        _refused(m1, "http", "411", "length_required")
        == _refused(m0, "http", "411", "length_required") + 1
    )


def test_log_names_the_credential_and_user_agent_never_the_token(serve):
    requests.post(
        f"{serve.otlp_url}/v1/traces",
        data=_body(),
        headers={**PB, "Authorization": f"Bearer {SECRET}"},
    )
    line = next(ln for ln in serve.log().splitlines() if "(unknown_token)" in ln)
    assert "'refusal-probe/1.0'" in line and "credential unknown token sha256:" in line
    assert SECRET not in serve.log()


def test_grpc_refusals_are_counted_and_accepted_requests_too(serve):
    m0 = _metrics(serve)
    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as ch:
        call = ch.unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as e:
            call(_body(), metadata=(("authorization", f"Bearer {SECRET}"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            call(b"\xff\xff\xff", metadata=(("authorization", "Bearer tok-acme"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        call(_body(), metadata=(("authorization", "Bearer tok-acme"),), timeout=10)
    m1 = _metrics(serve)
    for status, reason in (
        ("UNAUTHENTICATED", "unknown_token"),
        ("INVALID_ARGUMENT", "undecodable"),
    ):
        assert _refused(m1, "grpc", status, reason) == _refused(m0, "grpc", status, reason) + 1
    ok = ("handoffs_receiver_requests_total", (("status", "OK"), ("transport", "grpc")))
    assert m1[ok] == m0.get(ok, 0.0) + 1
    assert "refused grpc UNAUTHENTICATED (unknown_token)" in serve.log()
    assert SECRET not in serve.log()


def test_health_counts_refusals_and_metrics_show_the_pipeline(serve):
    r = requests.post(
        f"{serve.otlp_url}/v1/traces",
        data=_body("ef" * 8),
        headers={**PB, "Authorization": "Bearer tok-acme"},
    )
    assert r.status_code == 200
    health = serve.wait_stored(30)
    assert health["refused"].get("http 401 unknown_token", 0) >= 1
    m = _metrics(serve)
    accepted = m[("handoffs_receiver_accepted_spans_total", ())]
    stored = m[("handoffs_stored_spans_total", ())]
    duplicates = m[("handoffs_receiver_duplicate_requests_total", ())]
    # the gRPC test's request was this module's only other acknowledged one
    assert (accepted, stored, duplicates) == (2, 2, 0)
    assert m[("handoffs_store_up", ())] == 1
    assert m[("handoffs_spool_backlog_bytes", ())] == 0
    assert m[("handoffs_spool_oldest_unstored_age_seconds", ())] == 0
    assert m[("handoffs_store_write_duration_seconds_count", ())] >= 1
