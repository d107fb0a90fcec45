"""The OTLP port's HTTP framing, hand-made on raw sockets (what no polite client sends) and
with `requests`: chunked bodies, the size limit while reading, framing that is refused
before a byte is read, refusals that never let a body be read as a second request,
multi-member gzip, 405 on a known path, and a bad span id rejected alone.

Every check on what was stored reads it back through serve's query port after
`wait_stored` (serve's own `/health?wait_s=`): nothing here sleeps to wait.
"""

from __future__ import annotations

import gzip
import json
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ingest.testing import create_spans, request_json, request_protobuf
from serve.testing import start_serve
from tests.reliability._helpers import ACME, JS, PB, explains

LIMIT = 1024 * 1024  # hard_serve's --max-body-bytes
TOKEN = b"Authorization: Bearer tok-acme\r\n"
_rng = random.Random(20261202)


@pytest.fixture(scope="module")
def hard_serve(tmp_path_factory):
    h = start_serve(
        tmp_path_factory.mktemp("hardening"),
        "tok-acme=acme",
        extra_args=("--max-body-bytes", str(LIMIT)),
    )
    yield h
    assert h.stop() == 0, h.log()[-2000:]


# ------------------------------------------------------------------ helpers


def _spans(n: int, prefix: str) -> list[dict]:
    return create_spans(_rng.getrandbits(31), n, prefix=prefix)  # ids new in every call


def _ids(spans: list[dict]) -> list[str]:
    return [s["spanId"] for s in spans]


def _body(spans: list[dict], fmt: str) -> bytes:
    return (
        request_protobuf(spans) if fmt == "protobuf" else json.dumps(request_json(spans)).encode()
    )


def _stored(h, ids: list[str]) -> int:
    """Rows of otel_traces with these span ids, once serve has stored all it acknowledged."""
    h.wait_stored(60)
    c = h.client()
    try:
        return c.query(
            "SELECT count() FROM otel_traces WHERE SpanId IN {ids:Array(String)}",
            parameters={"ids": ids},
        ).result_rows[0][0]
    finally:
        c.close()


def _chunked(data: bytes, size: int = 1000) -> bytes:
    """`data` as a chunked body of `size`-byte chunks, with an extension and a trailer."""
    parts = [b"%x;n=%d\r\n%s\r\n" % (len(c), i, c) for i, c in enumerate(_split(data, size))]
    return b"".join(parts) + b"0\r\nX-Trailer: 1\r\n\r\n"


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _post_head(path: str = "/v1/traces", ctype: bytes = b"application/x-protobuf") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n" % (path.encode(), ctype)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # lowercase names
    body: bytes


class Conn:
    """One raw keep-alive connection: send bytes, read whole responses."""

    def __init__(self, h, timeout: float = 30) -> None:
        self.sock = socket.create_connection(("127.0.0.1", h.otlp_port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> Answer:
        line = self.file.readline()
        assert line.startswith(b"HTTP/1.1 "), line
        headers = {}
        while (hl := self.file.readline()) not in (b"\r\n", b""):
            k, _, v = hl.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = self.file.read(int(headers.get("content-length", 0)))
        return Answer(int(line.split()[1]), headers, body)

    def closed_by_serve(self) -> bool:
        """True when serve closed its side (EOF) with nothing more sent."""
        return self.file.read() == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def conn(hard_serve) -> Iterator[Conn]:
    c = Conn(hard_serve)
    yield c
    c.close()


def _message(a: Answer) -> str:
    from google.rpc import status_pb2

    if a.headers["content-type"] == "application/x-protobuf":
        return status_pb2.Status.FromString(a.body).message
    return json.loads(a.body)["message"]


# ------------------------------------------------------------------ chunked bodies


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_chunked_body_is_stored(hard_serve, conn, fmt, gz):
    """What every Node.js OTLP exporter sends: no Content-Length, Transfer-Encoding: chunked."""
    spans = _spans(20, f"chunked-{fmt}")
    body = _body(spans, fmt)
    body = gzip.compress(body) if gz else body
    ctype = b"application/x-protobuf" if fmt == "protobuf" else b"application/json"
    head = _post_head(ctype=ctype) + TOKEN + b"Transfer-Encoding: chunked\r\n"
    head += b"Content-Encoding: gzip\r\n" if gz else b""
    conn.send(head + b"\r\n" + _chunked(body, 333))
    a = conn.answer()
    assert a.status == 200, a
    assert "connection" not in a.headers  # kept alive: the next request on it works too
    more = _spans(3, f"chunked-{fmt}-next")
    conn.send(_post_head() + TOKEN + b"Transfer-Encoding: chunked\r\n\r\n")
    conn.send(_chunked(request_protobuf(more), 100))
    assert conn.answer().status == 200
    assert _stored(hard_serve, _ids(spans) + _ids(more)) == 23


def test_chunked_body_from_requests_is_stored(hard_serve):
    """requests sends a generator body chunked; one keep-alive session, several requests."""
    spans = [_spans(5, "req-chunked") for _ in range(3)]
    with requests.Session() as s:
        for batch in spans:
            body = request_protobuf(batch)
            r = s.post(
                f"{hard_serve.otlp_url}/v1/traces",
                data=iter(_split(body, 64)),
                headers={**PB, **ACME},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert r.request.headers["Transfer-Encoding"] == "chunked"
    assert _stored(hard_serve, [i for b in spans for i in _ids(b)]) == 15


def test_chunked_body_over_the_limit_is_413_before_the_rest_is_sent(hard_serve, conn):
    """The 413 comes as soon as the chunks pass the limit: the client has not finished
    (nor said how much is left), and serve has buffered no more than the limit."""
    conn.send(_post_head() + TOKEN + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"\x0a" * 65536
    for _ in range(LIMIT // len(chunk) + 1):
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    a = conn.answer()  # the body is not finished: no terminating chunk was sent
    assert a.status == 413
    assert f"chunked body exceeds the limit of {LIMIT} bytes" in _message(a)
    assert a.headers["connection"] == "close"


def test_chunked_body_over_the_limit_from_requests_is_413(hard_serve):
    """A client that reads only after sending everything still gets the 413 (serve discards
    the rest of the body, bounded, before it closes)."""
    body = b"\x0a" * (4 * LIMIT)
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=iter(_split(body, 1 << 16)),
        headers={**PB, **ACME},
        timeout=60,
    )
    assert r.status_code == 413
    assert "exceeds the limit" in explains(r, "protobuf")


def test_gzip_chunked_body_over_the_limit_after_gunzip_is_413(hard_serve, conn):
    body = gzip.compress(b"\0" * (8 * LIMIT))
    conn.send(_post_head() + TOKEN + b"Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n")
    conn.send(b"\r\n" + _chunked(body, 4096))
    a = conn.answer()
    assert a.status == 413 and "after gunzip" in _message(a)


@pytest.mark.parametrize(
    "cut",
    [b"100\r\nabc", b"3\r\nabc\r\n", b"3\r\nabc"],
    ids=["mid-chunk", "no-last-chunk", "no-chunk-end"],
)
def test_chunked_body_that_ends_early_is_400(hard_serve, conn, cut):
    conn.send(_post_head() + TOKEN + b"Transfer-Encoding: chunked\r\n\r\n" + cut)
    conn.sock.shutdown(socket.SHUT_WR)
    a = conn.answer()
    assert a.status == 400 and "truncated" in _message(a)
    assert a.headers["connection"] == "close" and conn.closed_by_serve()


def test_malformed_chunk_is_400_and_closes(hard_serve, conn):
    conn.send(_post_head() + TOKEN + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")
    a = conn.answer()
    assert a.status == 400 and "bad chunk size" in _message(a)
    assert a.headers["connection"] == "close" and conn.closed_by_serve()


# ------------------------------------------------------------------ Content-Length limit


def test_declared_content_length_over_the_limit_is_413_at_once(hard_serve, conn):
    """From the headers alone: the 413 arrives before any of the body was sent."""
    conn.send(_post_head() + TOKEN + f"Content-Length: {LIMIT + 1}\r\n\r\n".encode())
    a = conn.answer()
    assert a.status == 413
    assert f"body of {LIMIT + 1} bytes exceeds the limit of {LIMIT} bytes" in _message(a)
    assert a.headers["connection"] == "close"


def test_declared_content_length_over_the_limit_from_requests_is_413(hard_serve):
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=b"\x0a" * (8 * LIMIT),
        headers={**PB, **ACME},
        timeout=60,
    )
    assert r.status_code == 413
    assert "exceeds the limit" in explains(r, "protobuf")


def test_post_with_neither_content_length_nor_chunked_is_411(hard_serve, conn):
    conn.send(_post_head() + TOKEN + b"\r\n" + request_protobuf(_spans(1, "no-framing")))
    a = conn.answer()
    assert a.status == 411
    assert "Content-Length is required" in _message(a)
    assert a.headers["connection"] == "close" and conn.closed_by_serve()


# ------------------------------------------------------------------ framing refused


@pytest.mark.parametrize(
    ("framing", "message"),
    [
        (b"Content-Length: -1\r\n", "bad Content-Length '-1'"),
        (b"Content-Length: +{n}\r\n", "bad Content-Length '+"),
        (b"Content-Length: {n}\r\nContent-Length: 7\r\n", "conflicting Content-Length values"),
        (b"Content-Length: {n}, 7\r\n", "conflicting Content-Length values"),
        (
            b"Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length and Transfer-Encoding together",
        ),
        (b"Transfer-Encoding: gzip, chunked\r\n", "unsupported Transfer-Encoding"),
        (b"Transfer-Encoding: identity\r\n", "unsupported Transfer-Encoding"),
    ],
    ids=["cl-negative", "cl-plus", "cl-twice", "cl-list", "cl-and-te", "te-gzip", "te-identity"],
)
def test_invalid_or_conflicting_framing_is_400_and_nothing_is_read(
    hard_serve, conn, framing, message
):
    """Refused from the headers, before a byte of the body is read; serve closes the
    connection (it cannot know where the body ends) and stores nothing."""
    spans = _spans(4, "framing")
    body = request_protobuf(spans)
    conn.send(_post_head() + TOKEN + framing.replace(b"{n}", b"%d" % len(body)) + b"\r\n" + body)
    a = conn.answer()
    assert a.status == 400
    assert message in _message(a)
    assert a.headers["connection"] == "close" and conn.closed_by_serve()
    assert _stored(hard_serve, _ids(spans)) == 0


# ------------------------------------------------------------------ no request desync


def _hidden_request(spans: list[dict]) -> bytes:
    """A complete, valid, authenticated OTLP request: smuggled as another request's body."""
    body = request_protobuf(spans)
    return _post_head() + TOKEN + b"Content-Length: %d\r\n\r\n" % len(body) + body


REFUSALS = {
    "401-no-token": (b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n", 401),
    "401-bad-token": (
        b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
        b"Authorization: Bearer nope\r\n",
        401,
    ),
    "404-path": (b"POST /v1/logs HTTP/1.1\r\n" + TOKEN, 404),
    "405-put": (b"PUT /v1/traces HTTP/1.1\r\n" + TOKEN, 405),
    "405-get": (b"GET /v1/traces HTTP/1.1\r\n" + TOKEN, 405),
    "415-type": (b"POST /v1/traces HTTP/1.1\r\nContent-Type: text/plain\r\n" + TOKEN, 415),
    "415-encoding": (
        b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Encoding: br\r\n" + TOKEN,
        415,
    ),
    "400-health-query": (b"GET /health?bogus=1 HTTP/1.1\r\n", 400),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_request_body_is_never_read_as_a_request(hard_serve, conn, case, chunked):
    """The refused request's body is itself a whole valid request carrying spans. Serve
    answers the refusal alone, discards that body (the connection stays in step: the next
    real request on it is stored), and stores nothing of the hidden one."""
    head, status = REFUSALS[case]
    hidden_spans = _spans(3, f"hidden-{case}")
    hidden = _hidden_request(hidden_spans)
    framing = (
        b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(hidden, 50)
        if chunked
        else b"Content-Length: %d\r\n\r\n%s" % (len(hidden), hidden)
    )
    conn.send(head + b"Host: x\r\n" + framing)
    a = conn.answer()
    assert a.status == status, a
    if status == 405:
        assert a.headers["allow"] == "POST"
    real = _spans(2, f"after-{case}")
    conn.send(_hidden_request(real))
    b = conn.answer()
    conn.sock.shutdown(socket.SHUT_WR)
    rest = conn.file.read()
    assert _stored(hard_serve, _ids(hidden_spans)) == 0
    assert b.status == 200, b  # in step: this answer is the real request's, not the hidden's
    assert rest == b""  # and no third answer
    assert _stored(hard_serve, _ids(real)) == 2


def test_get_health_with_a_body_does_not_run_it_as_a_request(hard_serve, conn):
    hidden_spans = _spans(3, "hidden-health")
    hidden = _hidden_request(hidden_spans)
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(hidden))
    conn.send(hidden)
    assert conn.answer().status == 200
    conn.sock.shutdown(socket.SHUT_WR)
    rest = conn.file.read()
    assert _stored(hard_serve, _ids(hidden_spans)) == 0
    assert rest == b""


def test_refused_body_over_the_limit_closes_the_connection(hard_serve, conn):
    """A refused body larger than the limit is not worth discarding to keep the connection:
    serve answers with Connection: close (after discarding it, bounded, for the client)."""
    body = b"\x0a" * (2 * LIMIT)
    conn.send(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n")
    conn.send(b"Content-Length: %d\r\n\r\n" % len(body))
    a = conn.answer()
    assert a.status == 401
    assert a.headers["connection"] == "close"
    conn.send(body)
    conn.sock.shutdown(socket.SHUT_WR)
    assert conn.closed_by_serve()


# ------------------------------------------------------------------ multi-member gzip


def test_multi_member_gzip_protobuf_stores_every_member(hard_serve):
    """gzip(a) + gzip(b) is one gzip body holding a + b; two serialized protobuf messages
    concatenated are one message with both messages' spans (protobuf merges repeated
    fields), so every span of both is stored."""
    first, second = _spans(4, "gz-member-1"), _spans(6, "gz-member-2")
    body = gzip.compress(request_protobuf(first)) + gzip.compress(request_protobuf(second))
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=body,
        headers={**PB, **ACME, "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert _stored(hard_serve, _ids(first)) == 4
    assert _stored(hard_serve, _ids(second)) == 6


def test_multi_member_gzip_json_is_400_and_stores_nothing(hard_serve):
    """For JSON the members' concatenation is two documents, not one: refused whole, never a
    200 for half of it."""
    first, second = _spans(2, "gz-json-1"), _spans(2, "gz-json-2")
    body = gzip.compress(_body(first, "json")) + gzip.compress(_body(second, "json"))
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=body,
        headers={**JS, **ACME, "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 400
    assert "not valid JSON" in explains(r, "json")
    assert _stored(hard_serve, _ids(first) + _ids(second)) == 0


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (b"garbage", "bad data after a gzip member"),
        (b"\x1f\x8b\x08\x00", "gzip body is truncated (member 2)"),
    ],
    ids=["garbage", "cut-member"],
)
def test_bytes_after_a_gzip_member_are_400_and_store_nothing(hard_serve, tail, message):
    spans = _spans(3, "gz-trailing")
    body = gzip.compress(request_protobuf(spans)) + tail
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=body,
        headers={**PB, **ACME, "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 400
    assert message in explains(r, "protobuf")
    assert _stored(hard_serve, _ids(spans)) == 0


def test_multi_member_gzip_limit_is_on_the_total(hard_serve):
    member = gzip.compress(b"\x0a" * (LIMIT // 2 + 1))
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=member + member,
        headers={**PB, **ACME, "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 413
    assert "after gunzip" in explains(r, "protobuf")


# ------------------------------------------------------------------ methods


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
def test_other_methods_on_the_traces_path_are_405_allow_post(hard_serve, method):
    r = requests.request(method, f"{hard_serve.otlp_url}/v1/traces", headers=ACME, timeout=10)
    assert r.status_code == 405
    assert r.headers["Allow"] == "POST"
    if method != "HEAD":
        assert r.json()["message"] == f"method {method} is not allowed on /v1/traces; use POST"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_other_methods_on_health_are_405_allow_get(hard_serve, method):
    r = requests.request(method, f"{hard_serve.otlp_url}/health", data=b"{}", timeout=10)
    assert r.status_code == 405
    assert r.headers["Allow"] == "GET, HEAD"


def test_head_health_answers_without_a_body(hard_serve):
    r = requests.head(f"{hard_serve.otlp_url}/health", timeout=10)
    assert r.status_code == 200 and r.content == b""


def test_unknown_path_is_404_for_any_method(hard_serve):
    for method in ("GET", "POST", "PUT"):
        r = requests.request(method, f"{hard_serve.otlp_url}/v1/metrics", headers=ACME, timeout=10)
        assert r.status_code == 404, method


# ------------------------------------------------------------------ bad span ids


def test_json_span_with_a_bad_span_id_is_rejected_alone(hard_serve):
    good = _spans(3, "badid-json")
    not_hex, short = _spans(2, "badid-json-bad")
    not_hex["spanId"] = "zz" * 8
    short["spanId"] = "abcd"
    r = requests.post(
        f"{hard_serve.otlp_url}/v1/traces",
        data=json.dumps(request_json([good[0], not_hex, good[1], short, good[2]])),
        headers={**JS, **ACME},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    ps = r.json()["partialSuccess"]
    assert ps["rejectedSpans"] == "2"
    assert "spanId must be a hex string, got 'zzzzzzzzzzzzzzzz'" in ps["errorMessage"]
    assert "spanId must be 8 non-zero bytes, got 'abcd'" in ps["errorMessage"]
    assert _stored(hard_serve, _ids(good)) == 3


@pytest.fixture(scope="module", params=["python", "sql"])
def decoder_serve(tmp_path_factory, request):
    """serve with each protobuf decoder: `sql` (chDB) must decline the request with a bad
    span id to the Python decoder, which rejects that span alone."""
    h = start_serve(
        tmp_path_factory.mktemp(f"decoder-{request.param}"),
        "tok-acme=acme",
        extra_args=("--decoder", request.param),
    )
    yield h
    assert h.stop() == 0, h.log()[-2000:]


def test_protobuf_span_with_a_bad_span_id_is_rejected_alone(decoder_serve, request):
    good = _spans(4, "badid-pb")
    req = ExportTraceServiceRequest.FromString(request_protobuf(good + _spans(2, "badid-pb-bad")))
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[4].span_id = b"\x01" * 7
    spans[5].span_id = b""
    r = requests.post(
        f"{decoder_serve.otlp_url}/v1/traces",
        data=req.SerializeToString(),
        headers={**PB, **ACME},
        timeout=30,
    )
    assert r.status_code == 200
    ps = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert ps.rejected_spans == 2
    assert "spanId must be 8 non-zero bytes, got '01010101010101'" in ps.error_message
    assert _stored(decoder_serve, _ids(good)) == 4
    if request.node.callspec.params["decoder_serve"] == "sql":  # chDB tried it and declined
        assert decoder_serve.health()["sql_declined"] >= 1
