"""`handoffs serve` (subprocess) answering bad and good OTLP requests as the spec says.

One serve with two tenants' tokens per decoder (auto; sql = chDB first); each test asserts status code and message
and what was stored; the last test checks that every span acknowledged in the module is
stored exactly once.
"""

from __future__ import annotations

import gzip
import json
import random
import time

import pytest
import requests
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ingest.testing import request_json, request_protobuf, span_json, transition
from serve.testing import start_serve

TOKENS = "tok-acme=acme,tok-globex=globex"
ACME = {"Authorization": "Bearer tok-acme"}
PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
_rng = random.Random(20261130)
ACKED: list[str] = []  # span ids acknowledged with 200 and not rejected


@pytest.fixture(scope="module", params=["auto", "sql"])
def serve(tmp_path_factory, request):
    """`sql`: chDB tries every protobuf request first (ingest.chdb); every answer below
    must be the same as with the Python decoder."""
    ACKED.clear()
    h = start_serve(
        tmp_path_factory.mktemp("serve"), TOKENS, extra_args=("--decoder", request.param)
    )
    yield h
    assert h.stop() == 0, h.log()


@pytest.fixture(scope="module")
def ch(serve):
    c = serve.client()
    yield c
    c.close()


def _span(attrs, *, name="handoff"):
    sid = f"{_rng.getrandbits(64) | 1:016x}"
    return span_json(
        trace_id=f"{_rng.getrandbits(128) | 1:032x}",
        span_id=sid,
        attributes=attrs,
        start_ns=time.time_ns() - _rng.randrange(10**12),
        name=name,
    )


def _post(serve, body, headers, **kw):
    return requests.post(
        f"{serve.otlp_url}/v1/traces", data=body, headers=headers, timeout=60, **kw
    )


def _status(resp) -> status_pb2.Status:
    return status_pb2.Status.FromString(resp.content)


def test_health(serve):
    r = requests.get(f"{serve.otlp_url}/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_health_wait_answers_once_acknowledged_spans_are_stored(serve, ch):
    """`/health?wait_s=` returns when the writer has stored every acknowledged request (the
    writer lingers up to 0.5 s for more requests, so without the wait they are not stored
    yet), not after polling or sleeping on the caller's side."""
    spans = [_span(transition(f"h-wait-{i}", "create", "", "created")) for i in range(50)]
    assert _post(serve, request_protobuf(spans), {**PB, **ACME}).status_code == 200
    ACKED.extend(s["spanId"] for s in spans)
    r = requests.get(f"{serve.otlp_url}/health?wait_s=60", timeout=90)
    assert r.status_code == 200
    assert r.json()["queued"] == 0 and r.json()["spool_backlog_bytes"] == 0, r.json()
    n = ch.query(
        "SELECT count() FROM otel_traces WHERE SpanId IN {ids:Array(String)}",
        parameters={"ids": [s["spanId"] for s in spans]},
    ).result_rows[0][0]
    assert n == 50


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("wait_s=soon", "wait_s must be one number of seconds from 0 to 600, got ['soon']"),
        ("wait_s=-1", "wait_s must be one number of seconds from 0 to 600, got ['-1']"),
        ("wait_s=601", "wait_s must be one number of seconds from 0 to 600, got ['601']"),
        ("wait_s=nan", "wait_s must be one number of seconds from 0 to 600, got ['nan']"),
        ("wait_s=1&wait_s=2", "wait_s must be one number of seconds from 0 to 600, got ['1', '2']"),
        ("wait_s", "bad query string 'wait_s'; use /health?wait_s=SECONDS"),
        ("wait_s=", "wait_s must be one number of seconds from 0 to 600, got ['']"),
        ("verbose=1", "unknown /health parameter(s) ['verbose']; the only one is wait_s"),
        ("a&&b", "bad query string 'a&&b'; use /health?wait_s=SECONDS"),
    ],
)
def test_health_wait_with_a_bad_parameter_is_a_400_that_says_why(serve, query, message):
    t0 = time.monotonic()
    r = requests.get(f"{serve.otlp_url}/health?{query}", timeout=10)
    assert r.status_code == 400
    assert r.json()["message"] == message
    assert time.monotonic() - t0 < 5  # answered at once, no wait


def test_good_batch_with_partly_bad_spans_gets_partial_success(serve, ch):
    good = [_span(transition(f"h-{i}", "create", "", "created")) for i in range(3)]
    bad = transition("h-bad", "create", "", "created")
    bad["handoff.deadline_ms"] = "soon"
    bad_span = _span(bad)
    r = _post(serve, request_protobuf([*good, bad_span]), {**PB, **ACME})
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 1
    assert "handoff.deadline_ms must be int, got string" in resp.partial_success.error_message
    ACKED.extend(s["spanId"] for s in good)
    serve.wait_stored()
    rows = ch.query(
        "SELECT reason, tenant FROM ingest_rejects WHERE span_id = {s:String}",
        parameters={"s": bad_span["spanId"]},
    ).result_rows
    assert rows == [("attribute handoff.deadline_ms must be int, got string", "acme")]
    n = ch.query(
        "SELECT count() FROM otel_traces WHERE SpanId IN {ids:Array(String)}",
        parameters={"ids": [s["spanId"] for s in good]},
    ).result_rows[0][0]
    assert n == 3


def test_json_with_gzip_is_accepted(serve, ch):
    spans = [_span(transition("h-json", "create", "", "created"))]
    body = gzip.compress(json.dumps(request_json(spans)).encode())
    r = _post(serve, body, {**JS, **ACME, "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == {}
    ACKED.extend(s["spanId"] for s in spans)


def test_truncated_protobuf_is_400(serve):
    body = request_protobuf([_span(transition("h-t", "create", "", "created"))])
    r = _post(serve, body[:-9], {**PB, **ACME})
    assert r.status_code == 400
    assert "not a valid OTLP ExportTraceServiceRequest protobuf" in _status(r).message


def _raw_post(serve, head: bytes, body: bytes) -> tuple[int, bytes]:
    """A hand-made HTTP/1.1 POST (what requests would never send); returns status, body."""
    import socket

    with socket.create_connection(("127.0.0.1", serve.otlp_port), timeout=30) as s:
        s.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Authorization: Bearer tok-acme\r\nConnection: close\r\n" + head + b"\r\n" + body
        )
        s.shutdown(socket.SHUT_WR)  # the body ends here, whatever Content-Length said
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def test_bad_content_length_is_4xx_and_nothing_is_lost(serve, ch):
    """Content-Length is read twice (the handler announces a large protobuf body to the chDB
    decoder from its headers): missing, not a number or longer than the body each get a clear
    4xx, and the next request is stored as usual."""
    body = request_protobuf([_span(transition("h-cl", "create", "", "created"))])
    status, out = _raw_post(serve, b"", body)
    assert status == 411 and "Content-Length is required" in _status_of(out)
    status, out = _raw_post(serve, b"Content-Length: abc\r\n", body)
    assert status == 400 and "bad Content-Length 'abc'" in _status_of(out)
    status, out = _raw_post(serve, f"Content-Length: {len(body) + 500}\r\n".encode(), body)
    assert status == 400 and f"body truncated: got {len(body)} of {len(body) + 500}" in _status_of(
        out
    )
    spans = [_span(transition("h-cl-ok", "create", "", "created")) for _ in range(3)]
    r = _post(serve, request_protobuf(spans), {**PB, **ACME})
    assert r.status_code == 200 and not ExportTraceServiceResponse.FromString(r.content).HasField(
        "partial_success"
    )
    ACKED.extend(s["spanId"] for s in spans)
    assert serve.health()["status"] == "ok"


def _status_of(body: bytes) -> str:
    return status_pb2.Status.FromString(body).message


def test_wrong_json_shape_is_400_naming_the_path(serve):
    r = _post(serve, json.dumps({"resourceSpans": [{"scopeSpans": {"spans": []}}]}), {**JS, **ACME})
    assert r.status_code == 400
    assert "resourceSpans[0].scopeSpans: expected an array" in r.json()["message"]


def test_wrong_attribute_types_reject_spans(serve, ch):
    a = transition("h-w", "create", "", "created")
    a["handoff.capabilities"] = "search"
    r = _post(serve, json.dumps(request_json([_span(a)])), {**JS, **ACME})
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert ps["rejectedSpans"] == "1"
    assert "handoff.capabilities must be string[], got string" in ps["errorMessage"]


def test_illegal_transition_is_stored_and_flagged(serve, ch):
    s = _span(transition("h-illegal", "commit", "created", "committed"))
    r = _post(serve, request_protobuf([s]), {**PB, **ACME})
    assert r.status_code == 200
    assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
    ACKED.append(s["spanId"])
    serve.wait_stored()
    rows = ch.query(
        "SELECT valid, attributes['handoff.invalid_reason'], tenant FROM handoff_transitions "
        "WHERE span_id = {s:String}",
        parameters={"s": s["spanId"]},
    ).result_rows
    assert len(rows) == 1
    valid, reason, tenant = rows[0]
    assert valid is False and "not allowed from state 'created'" in reason and tenant == "acme"


def test_body_over_the_limit_is_413(serve):
    body = b"\x0a" * (50 * 1024 * 1024)
    r = _post(serve, body, {**PB, **ACME})
    assert r.status_code == 413
    assert "exceeds the limit" in _status(r).message


def test_gzip_bomb_is_413(serve):
    body = gzip.compress(b"\x00" * (20 * 1024 * 1024))
    r = _post(serve, body, {**PB, **ACME, "Content-Encoding": "gzip"})
    assert r.status_code == 413
    assert "after gunzip" in _status(r).message


def test_unknown_content_type_is_415(serve):
    r = _post(serve, b"hello", {"Content-Type": "text/plain", **ACME})
    assert r.status_code == 415
    assert "unsupported Content-Type 'text/plain'" in r.json()["message"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [({}, "missing bearer token"), ({"Authorization": "Bearer nope"}, "unknown bearer token")],
)
def test_missing_or_wrong_token_is_401(serve, headers, message):
    body = request_protobuf([_span(transition("h-a", "create", "", "created"))])
    r = _post(serve, body, {**PB, **headers})
    assert r.status_code == 401
    assert _status(r).message.startswith(message)


def test_span_claiming_another_tenant_is_stored_under_the_credential(serve, ch):
    a = transition("h-claim", "create", "", "created")
    a["handoff.tenant"] = "acme"  # claims acme, sent with globex's token
    s = _span(a)
    r = _post(serve, request_protobuf([s]), {**PB, "Authorization": "Bearer tok-globex"})
    assert r.status_code == 200
    ACKED.append(s["spanId"])
    serve.wait_stored()
    rows = ch.query(
        "SELECT tenant, claimed_tenant, attributes['handoff.tenant_mismatch'] FROM handoff_transitions "
        "WHERE span_id = {s:String}",
        parameters={"s": s["spanId"]},
    ).result_rows
    assert rows == [("globex", "acme", "true")]
    assert ch.query(
        "SELECT Tenant FROM otel_traces WHERE SpanId = {s:String}", parameters={"s": s["spanId"]}
    ).result_rows == [("globex",)]


def test_retried_request_is_stored_once(serve, ch):
    spans = [_span(transition("h-retry", "create", "", "created"))]
    body = request_protobuf(spans)
    for _ in range(3):
        assert _post(serve, body, {**PB, **ACME}).status_code == 200
    ACKED.extend(s["spanId"] for s in spans)
    serve.wait_stored()
    assert serve.health()["duplicate_batches"] >= 2


def test_query_port_is_read_only(ch):
    from clickhouse_connect.driver.exceptions import DatabaseError

    with pytest.raises(DatabaseError, match="READONLY") as exc:
        ch.command("TRUNCATE TABLE otel_traces")
    assert exc.value.code == 164
    with pytest.raises(DatabaseError):
        ch.insert("otel_traces", [["x"]], column_names=["TraceId"])


def test_embedded_engine_hands_freed_memory_back_promptly(ch):
    # serve sets jemalloc's options for the embedded ClickHouse before chDB loads
    # (serve._tuning.JEMALLOC_CONF): freed pages go back to the OS after 200 ms, not 5 s
    from serve._tuning import JEMALLOC_CONF

    stats = str(ch.command("SELECT * FROM system.jemalloc_stats FORMAT TSVRaw"))
    opts = dict(kv.split(":") for kv in JEMALLOC_CONF.split(","))
    ms = opts["dirty_decay_ms"]
    assert f"opt.dirty_decay_ms: {ms} (arenas.dirty_decay_ms: {ms})" in stats
    # and each thread caches only small freed blocks (jemalloc's default: up to 32 KiB)
    assert f"opt.tcache_max: {opts['tcache_max']}\n" in stats


def test_ledger_and_batch_chain_match(serve, ch):
    serve.wait_stored()  # earlier tests may have left a write in flight
    tl = ch.query("SELECT count() FROM transition_ledger").result_rows[0][0]
    ht = ch.query("SELECT count() FROM handoff_transitions").result_rows[0][0]
    assert tl == ht > 0
    rows = ch.query("SELECT prev_chain_hash, chain_hash FROM ingest_batches").result_rows
    prevs = {p for p, _ in rows}
    heads = [c for _, c in rows if c not in prevs]
    assert len(heads) == 1  # one unbroken chain
    assert sum(1 for p, _ in rows if p == b"0" * 64 or p == "0" * 64) == 1


def test_spans_with_extreme_clocks_are_kept(serve, ch):
    # Retention counts from ingest, so an agent clock at 1970 or near 2262 loses nothing.
    spans = []
    for name, ts in (("h-epoch", 10**9), ("h-2262", 2**63 - 1)):
        s = _span(transition(name, "create", "", "created"))
        s["startTimeUnixNano"] = str(ts)
        s["endTimeUnixNano"] = str(ts)
        spans.append(s)
    r = _post(serve, request_protobuf(spans), {**PB, **ACME})
    assert r.status_code == 200
    assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
    ACKED.extend(s["spanId"] for s in spans)
    serve.wait_stored()
    rows = ch.query(
        "SELECT handoff_id FROM handoff_transitions WHERE handoff_id IN ('h-epoch', 'h-2262') ORDER BY time"
    ).result_rows
    assert rows == [("h-epoch",), ("h-2262",)]


def test_every_acknowledged_span_is_stored_exactly_once(serve, ch):
    serve.wait_stored()
    rows = ch.query(
        "SELECT SpanId, count() FROM otel_traces WHERE SpanId IN {ids:Array(String)} GROUP BY SpanId",
        parameters={"ids": ACKED},
    ).result_rows
    assert len(ACKED) >= 7
    assert dict(rows) == dict.fromkeys(ACKED, 1)


def test_the_sql_decoder_took_the_clean_requests_and_declined_the_rest(serve, request):
    health = serve.health()
    if request.node.callspec.params["serve"] == "sql":
        # clean protobuf requests went through chDB; bad ones were declined to Python
        assert health["sql_decoded"] >= 3 and health["sql_declined"] >= 3, health
        # each round trip decodes one request or several queued together
        sent = health["sql_decoded"] + health["sql_declined"]
        assert 1 <= health["sql_decode_rounds"] <= sent, health
    else:  # auto: these small requests stay in Python
        assert health["sql_decoded"] == 0 and health["sql_decode_rounds"] == 0, health


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--decoder", "bogus"], {}, "invalid choice: 'bogus'"),
        ([], {"HANDOFFS_DECODER": "bogus"}, "decoder 'bogus': use one of auto, sql, python"),
        (["--min-free-disk-bytes", "-5"], {}, "--min-free-disk-bytes must be 0 or more bytes"),
        ([], {"HANDOFFS_MIN_FREE_DISK_BYTES": "lots"}, "must be an integer, got 'lots'"),
        ([], {"HANDOFFS_DERIVE_HOLD_S": "soon"}, "HANDOFFS_DERIVE_HOLD_S must be 0 or more seconds, got 'soon'"),
        ([], {"HANDOFFS_DERIVE_HOLD_S": "-1"}, "HANDOFFS_DERIVE_HOLD_S must be 0 or more seconds, got '-1'"),
        ([], {"HANDOFFS_QUERY_HEADER_TIMEOUT_S": "0"}, "HANDOFFS_QUERY_HEADER_TIMEOUT_S must be more than 0 seconds, got '0'"),
        ([], {"HANDOFFS_QUERY_HEADER_TIMEOUT_S": "inf"}, "HANDOFFS_QUERY_HEADER_TIMEOUT_S must be more than 0 seconds, got 'inf'"),
    ],
)  # fmt: skip
def test_bad_options_exit_2_naming_the_option(tmp_path, args, env, message):
    """What serve says of a bad option or setting, before it opens anything: exit 2, one
    line naming the option or variable, the value and what is allowed."""
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "serve", "--store", f"chdb://{tmp_path}/d", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_start_serve_refuses_a_port_someone_else_listens_on(tmp_path):
    """Otherwise /health is answered by the other listener and the demo sends its traffic
    there while its own serve failed to bind (seen with two demos on the default ports)."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"OTLP port {port} on 127.0.0.1 is in use"):
            start_serve(tmp_path, otlp_port=port)
