"""OTLP/gRPC on `handoffs serve`: the OTel Python gRPC exporter and a raw grpc stub against a
serve subprocess (two tenants' tokens), and in-process receivers on a real Ingestor for
back-pressure (a spool that is full, a store that refuses inserts, a spool disk that is full).

Each test asserts the gRPC status (and its google.rpc.Status / RetryInfo trailers) and what
was stored; the last module test checks that every span acknowledged is stored exactly once.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import Compression, OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

import analytics
from collector import Envelope, HandoffTracer, InMemoryRecorder
from ingest import Ingestor, Spool
from ingest._otlp_grpc import GrpcConfig, start_grpc_server
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve

TOKENS = "tok-acme=acme,tok-globex=globex"
ACME = (("authorization", "Bearer tok-acme"),)
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_rng = random.Random(20261201)
ACKED: list[str] = []  # span ids acknowledged with OK (and not rejected) by the module serve


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    ACKED.clear()
    h = start_serve(tmp_path_factory.mktemp("grpc-serve"), TOKENS)
    yield h
    assert h.stop() == 0, h.log()


@pytest.fixture(scope="module")
def ch(serve):
    c = serve.client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def channel(serve):
    with grpc.insecure_channel(serve.grpc_target) as c:
        yield c


@pytest.fixture(scope="module")
def stub(channel):
    return TraceServiceStub(channel)


def _span(attrs: dict) -> dict:
    return span_json(
        trace_id=f"{_rng.getrandbits(128) | 1:032x}",
        span_id=f"{_rng.getrandbits(64) | 1:016x}",
        attributes=attrs,
        start_ns=time.time_ns() - _rng.randrange(10**12),
    )


def _creates(prefix: str, n: int) -> list[dict]:
    return [_span(transition(f"{prefix}-{i}", "create", "", "created")) for i in range(n)]


def _request(spans: list[dict]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(request_protobuf(spans))


def _stored(ch, span_ids, table: str = "otel_traces", column: str = "SpanId") -> dict[str, int]:
    rows = ch.query(
        f"SELECT {column}, count() FROM {table} WHERE {column} IN {{ids:Array(String)}} "
        f"GROUP BY {column}",
        parameters={"ids": list(span_ids)},
    ).result_rows
    return dict(rows)


def _exporter(serve, token: str | None = "tok-acme", **kw) -> OTLPSpanExporter:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return OTLPSpanExporter(
        endpoint=serve.grpc_target, insecure=True, headers=headers, timeout=30, **kw
    )


def _shim_handoffs(prefix: str) -> InMemoryRecorder:
    """Three handoffs through the product's shim: committed with evidence, rejected, failed."""
    rec = InMemoryRecorder(resource=Resource.create({"service.name": "grpc-agents"}))
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    coder = HandoffTracer("coder", tracer_provider=rec.provider)
    for name in ("commit", "reject", "fail"):
        env = Envelope(
            task_id=f"{prefix}-task",
            handoff_id=f"{prefix}-{name}",
            from_agent="planner",
            to_agent="coder",
            mode="delegate",
            capabilities=("code.write",),
            deadline_ms=60_000,
        )
        h = coder.receive(planner.create(env).to_wire())
        if name == "reject":
            h.reject()
            continue
        h.accept()
        h.start()
        if name == "fail":
            h.fail(error_code="tests_red")
            continue
        h.prepare(evidence_count=2, evidence_valid=True, evidence_refs=["test:1", "doc:2"])
        h.commit(receipt_status="ok")
    return rec


def _span_ids(rec: InMemoryRecorder) -> list[str]:
    return [f"{s.context.span_id:016x}" for s in rec.spans()]


# ------------------------------------------------------------------ the real exporter


@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip], ids=["identity", "gzip"]
)
def test_shim_spans_over_the_grpc_exporter_are_stored_and_counted(serve, ch, compression):
    """The product's shim -> the OTel Python OTLP/gRPC exporter (gzip or not) -> serve:
    every transition stored once under the token's tenant, and the funnel counts them."""
    prefix = f"g-shim-{compression.name}"
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    rec = _shim_handoffs(prefix)
    spans = rec.spans()
    assert len(spans) == 11  # 5 + 2 + 4 transitions (receiving emits none)
    exporter = _exporter(serve, "tok-globex", compression=compression)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    ids = _span_ids(rec)
    ACKED.extend(ids)
    serve.wait_stored()
    assert _stored(ch, ids) == dict.fromkeys(ids, 1)
    rows = ch.query(
        "SELECT handoff_id, groupArray(event), any(tenant), min(valid) FROM ("
        "SELECT handoff_id, event, tenant, valid FROM handoff_transitions "
        "WHERE handoff_id LIKE {p:String} ORDER BY time) GROUP BY handoff_id ORDER BY handoff_id",
        parameters={"p": f"{prefix}-%"},
    ).result_rows
    assert rows == [
        (f"{prefix}-commit", ["create", "accept", "start", "prepare", "commit"], "globex", True),
        (f"{prefix}-fail", ["create", "accept", "start", "fail"], "globex", True),
        (f"{prefix}-reject", ["create", "reject"], "globex", True),
    ]
    assert ch.query(
        "SELECT DISTINCT Tenant FROM otel_traces WHERE SpanId IN {ids:Array(String)}",
        parameters={"ids": ids},
    ).result_rows == [("globex",)]
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))
    row = analytics.funnel(ch, database=serve.database, window=window, tenant="globex").iloc[0]
    got = {k: int(row[k]) for k in ("volume", "settled", "accepted", "executed", "committed")}
    # executed = reached prepared or later: the failed one was accepted but not executed
    assert got == {"volume": 3, "settled": 3, "accepted": 2, "executed": 1, "committed": 1}
    assert (int(row["evidenced"]), row["p_e2e"]) == (1, pytest.approx(1 / 3))


def test_exporter_without_or_with_a_wrong_token_fails_and_nothing_is_stored(serve, ch):
    """UNAUTHENTICATED is not retryable: the exporter reports FAILURE at once."""
    rec = _shim_handoffs("g-noauth")
    for token in (None, "nope"):
        exporter = _exporter(serve, token)
        try:
            t0 = time.monotonic()
            assert exporter.export(rec.spans()) == SpanExportResult.FAILURE
            assert time.monotonic() - t0 < 10  # no retries with backoff
        finally:
            exporter.shutdown()
    serve.wait_stored()
    assert _stored(ch, _span_ids(rec)) == {}


# ------------------------------------------------------------------ a raw stub


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "missing bearer token"),
        ((("authorization", "Basic dG9rLWFjbWU="),), "missing bearer token"),
        ((("authorization", "Bearer nope"),), "unknown bearer token"),
    ],
)
def test_missing_or_wrong_token_is_unauthenticated(serve, ch, stub, metadata, message):
    spans = _creates("g-auth", 2)
    with pytest.raises(grpc.RpcError) as exc:
        stub.Export(_request(spans), metadata=metadata, timeout=30)
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert exc.value.details().startswith(message)
    serve.wait_stored()
    assert _stored(ch, [s["spanId"] for s in spans]) == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xff\xff\xff garbage", "not a valid OTLP ExportTraceServiceRequest protobuf"),
        (request_protobuf(_creates("g-trunc", 1))[:-9], "not a valid OTLP"),
    ],
)
def test_bytes_that_are_not_a_request_are_invalid_argument(serve, channel, body, message):
    """A generic unary call sends the bytes as they are (no client-side serializer)."""
    export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as exc:
        export(body, metadata=ACME, timeout=30)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in exc.value.details()
    status = _trailer_status(exc.value)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert not status.details  # no RetryInfo: not to be retried


def test_one_invalid_span_gets_partial_success_and_the_rest_is_stored(serve, ch, stub):
    good = _creates("g-partial", 3)
    bad_attrs = transition("g-partial-bad", "create", "", "created")
    bad_attrs["handoff.deadline_ms"] = "soon"
    bad = _span(bad_attrs)
    resp = stub.Export(_request([*good, bad]), metadata=ACME, timeout=30)
    assert resp.partial_success.rejected_spans == 1
    assert "handoff.deadline_ms must be int, got string" in resp.partial_success.error_message
    ids = [s["spanId"] for s in good]
    ACKED.extend(ids)
    serve.wait_stored()
    assert _stored(ch, ids) == dict.fromkeys(ids, 1)
    assert ch.query(
        "SELECT reason, tenant FROM ingest_rejects WHERE span_id = {s:String}",
        parameters={"s": bad["spanId"]},
    ).result_rows == [("attribute handoff.deadline_ms must be int, got string", "acme")]


def test_full_success_leaves_partial_success_unset(stub):
    spans = _creates("g-full", 2)
    resp = stub.Export(_request(spans), metadata=ACME, timeout=30)
    assert resp == ExportTraceServiceResponse() and not resp.HasField("partial_success")
    ACKED.extend(s["spanId"] for s in spans)


def test_gzip_compressed_call_is_accepted(serve, ch, stub):
    spans = _creates("g-gzip", 5)
    stub.Export(_request(spans), metadata=ACME, compression=grpc.Compression.Gzip, timeout=30)
    ids = [s["spanId"] for s in spans]
    ACKED.extend(ids)
    serve.wait_stored()
    assert _stored(ch, ids) == dict.fromkeys(ids, 1)


def test_message_over_the_size_limit_is_resource_exhausted_even_gzipped(serve, ch, stub):
    """serve's max body size (16 MiB) bounds the message after decompression, as over HTTP
    (413 for a gzip bomb); RESOURCE_EXHAUSTED without RetryInfo: not to be retried."""
    attrs = transition("g-huge", "create", "", "created", note="x" * (17 << 20))
    big = _span(attrs)
    for compression in (grpc.Compression.NoCompression, grpc.Compression.Gzip):
        with pytest.raises(grpc.RpcError) as exc:
            stub.Export(_request([big]), metadata=ACME, compression=compression, timeout=60)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.value.details()
        assert "larger than max" in exc.value.details()
    serve.wait_stored()
    assert _stored(ch, [big["spanId"]]) == {}


def test_the_same_request_sent_twice_is_stored_once(serve, ch, stub):
    """A transport resend (the client did not see the first answer): the same bytes twice.
    Today the second is recognised by its batch id (tenant + hash of the bytes) and skipped."""
    spans = _creates("g-resend", 4)
    req = _request(spans)
    before = serve.health()["duplicate_batches"]
    for _ in range(2):
        assert stub.Export(req, metadata=ACME, timeout=30) == ExportTraceServiceResponse()
    ACKED.extend(s["spanId"] for s in spans)
    serve.wait_stored()
    ids = [s["spanId"] for s in spans]
    assert _stored(ch, ids) == dict.fromkeys(ids, 1)
    assert _stored(ch, ids, "handoff_transitions", "span_id") == dict.fromkeys(ids, 1)
    assert serve.health()["duplicate_batches"] == before + 1


def test_start_up_line_names_the_grpc_address(serve):
    assert f"OTLP gRPC 127.0.0.1:{serve.grpc_port}" in serve.log()
    assert f"OTLP http://127.0.0.1:{serve.otlp_port}/v1/traces" in serve.log()


def test_grpc_binds_loopback_by_default(serve):
    """Like the OTLP/HTTP port: not reachable from another interface unless --host says so."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outbound interface
            ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
    if ip.startswith("127."):
        pytest.skip("no non-loopback interface to probe from")
    with pytest.raises(OSError), socket.create_connection((ip, serve.grpc_port), timeout=5):
        pass


def test_every_acknowledged_span_is_stored_exactly_once(serve, ch):
    serve.wait_stored()
    assert len(ACKED) >= 30
    assert _stored(ch, ACKED) == dict.fromkeys(ACKED, 1)


# ------------------------------------------------------------------ off


def test_grpc_port_0_turns_the_receiver_off(tmp_path):
    """`--grpc-port 0` wins over HANDOFFS_GRPC_PORT: nothing listens on that port."""
    from serve.testing import free_port

    port = free_port()
    h = start_serve(tmp_path, grpc_port=0, env={"HANDOFFS_GRPC_PORT": str(port)})
    try:
        assert "OTLP gRPC" not in h.log()
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
    finally:
        assert h.stop() == 0


# ------------------------------------------------------------------ back-pressure


def _trailer_status(err: grpc.RpcError) -> status_pb2.Status:
    meta = dict(err.trailing_metadata() or ())
    return status_pb2.Status.FromString(meta["grpc-status-details-bin"])


def _retry_delay_s(err: grpc.RpcError) -> float:
    """The RetryInfo of an error, from the google.rpc.Status detail; asserts it is there and
    that the bare RetryInfo trailer (what the OTel Python exporter reads) agrees."""
    status = _trailer_status(err)
    assert status.code == err.code().value[0] and status.message == err.details()
    (detail,) = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    bare = dict(err.trailing_metadata())["google.rpc.retryinfo-bin"]
    assert error_details_pb2.RetryInfo.FromString(bare) == info
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9


def _one(i: int) -> bytes:
    return request_protobuf(
        [
            span_json(
                trace_id=f"{i + 1:032x}",
                span_id=f"{i + 1:016x}",
                attributes=transition(f"h-bp-{i}", "create", "", "created"),
                start_ns=time.time_ns(),
            )
        ]
    )


@pytest.fixture
def receiver():
    """start(ingestor) -> (a stub on an in-process OTLP/gRPC receiver (no auth), its address)."""
    started = []

    def start(ingestor: Ingestor) -> tuple[TraceServiceStub, str]:
        rx = start_grpc_server("127.0.0.1", 0, ingestor, GrpcConfig(1 << 20))
        chan = grpc.insecure_channel(rx.address)
        started.append((rx, chan))
        return TraceServiceStub(chan), rx.address

    yield start
    for rx, chan in started:
        chan.close()
        rx.stop(0)


def test_full_spool_is_unavailable_with_retry_info_and_keeps_what_it_acknowledged(
    chdb_client, fresh_db, tmp_path, receiver
):
    spool = Spool(tmp_path / "spool", max_bytes=100)
    ing = Ingestor(chdb_client, fresh_db, spool)
    stub, _ = receiver(ing)  # the writer is not started yet: nothing leaves the spool
    stub.Export(ExportTraceServiceRequest.FromString(_one(1)), timeout=30)
    with pytest.raises(grpc.RpcError) as exc:
        stub.Export(ExportTraceServiceRequest.FromString(_one(2)), timeout=30)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "spool holds" in exc.value.details()
    assert _retry_delay_s(exc.value) == 1.0
    ing.start()
    assert ing.wait_idle(60)
    stub.Export(ExportTraceServiceRequest.FromString(_one(2)), timeout=30)  # the retry
    assert ing.wait_idle(60)
    assert ing.stop()
    spans = chdb_client.query(
        f"SELECT SpanId FROM {fresh_db}.otel_traces ORDER BY SpanId"
    ).result_rows
    assert spans == [(f"{2:016x}",), (f"{3:016x}",)]


class _Seen(logging.Handler):
    """Sets `event` when a log record's message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if self.text in self.messages[-1]:
            self.event.set()


def test_the_exporter_retries_a_full_spool_and_its_spans_are_stored(
    chdb_client, fresh_db, tmp_path, receiver
):
    """The OTel exporter, told UNAVAILABLE + RetryInfo, waits and sends again: once the
    spool has room the export succeeds and every span is stored once."""
    spool = Spool(tmp_path / "spool", max_bytes=100)
    ing = Ingestor(chdb_client, fresh_db, spool)
    stub, address = receiver(ing)
    stub.Export(ExportTraceServiceRequest.FromString(_one(10)), timeout=30)  # fills the spool
    rec = _shim_handoffs("g-bp")
    seen = _Seen("spool holds")
    exp_log = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    exp_log.addHandler(seen)
    result: list[SpanExportResult] = []
    exporter = OTLPSpanExporter(endpoint=address, insecure=True, timeout=60)
    t = threading.Thread(target=lambda: result.append(exporter.export(rec.spans())))
    try:
        t.start()
        assert seen.event.wait(30), seen.messages  # the exporter was refused and waits
        assert any("retrying in 1.00s" in m for m in seen.messages), seen.messages
        ing.start()  # the spool drains; the exporter's retry finds room
        t.join(60)
    finally:
        exp_log.removeHandler(seen)
        exporter.shutdown()
    assert result == [SpanExportResult.SUCCESS]
    assert ing.wait_idle(60)
    assert ing.stop()
    ids = [*_span_ids(rec), f"{11:016x}"]
    assert _stored(chdb_client, ids, f"{fresh_db}.otel_traces") == dict.fromkeys(ids, 1)


def test_store_refusing_inserts_is_unavailable_and_the_spool_keeps_every_ack(
    chdb_client, chdb_path, fresh_db, tmp_path, receiver
):
    """The store refuses inserts (below its free-disk guard, ClickHouse code 243): once the
    writer has seen it, calls get UNAVAILABLE + RetryInfo; what was acknowledged before is
    in the spool and stored by the next start on a store that accepts it."""
    from foundation.store import StoreSpec, connect

    spec = StoreSpec(kind="chdb", path=str(chdb_path), database=fresh_db)
    full = connect(spec, settings_={"min_free_disk_bytes_to_perform_insert": str(1 << 60)})
    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir, max_bytes=1 << 30)
    ing = Ingestor(full, fresh_db, spool)
    ing.start()
    stub, _ = receiver(ing)
    acked: list[int] = []
    deadline = time.monotonic() + 60
    for i in range(100, 100_000):  # a client sending until it is pushed back
        try:
            stub.Export(ExportTraceServiceRequest.FromString(_one(i)), timeout=30)
        except grpc.RpcError as exc:
            refused = exc
            break
        acked.append(i)
        assert time.monotonic() < deadline, "the store's refusal never reached the client"
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "store is failing" in refused.details() and "243" in refused.details()
    assert _retry_delay_s(refused) == 1.0
    assert acked  # the first call is spooled before the writer tries the store
    # not drained: the write failing once stop() is called is not retried, its records stay
    assert not ing.stop(timeout=30)
    spool.close()
    full.close()
    ing2 = Ingestor(chdb_client, fresh_db, Spool(spool_dir, max_bytes=1 << 30))
    assert ing2.start() == len(acked)
    assert ing2.stop()
    ids = [f"{i + 1:016x}" for i in acked]
    assert _stored(chdb_client, ids, f"{fresh_db}.otel_traces") == dict.fromkeys(ids, 1)


def test_spool_disk_full_is_unavailable_then_the_retry_is_stored(
    chdb_client, fresh_db, tmp_path, receiver
):
    """The spool's disk is full (a filled tmpfs; needs root, skipped otherwise): the append
    fails, the call gets UNAVAILABLE + RetryInfo; with space back, the retry is stored."""
    from tests.reliability._helpers import fill, tmpfs

    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        spool = Spool(mnt / "spool", max_bytes=1 << 30)
        ing = Ingestor(chdb_client, fresh_db, spool)
        ing.start()
        stub, _ = receiver(ing)
        ballast = fill(mnt)
        req = ExportTraceServiceRequest.FromString(_one(200))
        with pytest.raises(grpc.RpcError) as exc:
            stub.Export(req, timeout=30)
        os.unlink(ballast)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "spool write failed" in exc.value.details()
        assert _retry_delay_s(exc.value) == 1.0
        stub.Export(req, timeout=30)  # the client's retry
        assert ing.wait_idle(60)
        assert ing.stop()
        spool.close()
    assert _stored(chdb_client, [f"{201:016x}"], f"{fresh_db}.otel_traces") == {f"{201:016x}": 1}


def test_bench_compares_grpc_with_http_in_one_run():
    """bench/ingest_throughput.py --transport grpc runs (a small run: figures only, no speed
    asserted) and prints both transports' figures, their ratio and the RESULT fields."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = ["--transport", "grpc", "--requests", "3", "--spans", "1000", "--no-baseline"]
    out = subprocess.run(
        [sys.executable, str(root / "bench" / "ingest_throughput.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "--- serve --decoder auto, OTLP/http" in text
    assert "--- serve --decoder auto, OTLP/grpc" in text
    assert text.count("stored transitions: 3000 of 3000") == 2
    assert re.search(r"OTLP/gRPC vs OTLP/HTTP in this run .*= [0-9.]+x", text), text
    last = text.strip().splitlines()[-1]
    assert re.fullmatch(
        r"RESULT spans_per_s=\d+ parse_ratio=[0-9.]+ rss_mb=\d+ anon_mb=\d+ "
        r"http_spans_per_s=\d+ grpc_vs_http=[0-9.]+",
        last,
    ), last
