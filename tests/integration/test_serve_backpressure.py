"""503 + Retry-After instead of accept-then-drop: a full spool, a store that is down.

In-process: a real Ingestor + OTLP server on the session's chDB, or on a real
clickhouse-connect HTTP client aimed at a port where nothing listens (the store is down).
"""

from __future__ import annotations

import threading
import time

import clickhouse_connect
import pytest
import requests

from ingest import Ingestor, Spool
from ingest._otlp_http import OtlpConfig, make_otlp_server
from ingest.testing import request_protobuf, span_json, transition
from serve._query_http import QueryEngine, make_query_server

PB = {"Content-Type": "application/x-protobuf"}


def _body(i: int) -> bytes:
    s = span_json(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        attributes=transition(f"h-{i}", "create", "", "created"),
        start_ns=time.time_ns(),
    )
    return request_protobuf([s])


@pytest.fixture
def serve_on(tmp_path):
    servers = []

    def start(ingestor: Ingestor) -> str:
        srv = make_otlp_server("127.0.0.1", 0, ingestor, OtlpConfig(1 << 20, {}))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1/traces"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_full_spool_answers_503_and_keeps_what_it_accepted(
    chdb_client, fresh_db, tmp_path, serve_on
):
    spool = Spool(tmp_path / "spool", max_bytes=100)
    ing = Ingestor(chdb_client, fresh_db, spool)
    url = serve_on(ing)  # writer not started yet: nothing leaves the spool
    first = requests.post(url, data=_body(1), headers=PB, timeout=30)
    assert first.status_code == 200
    second = requests.post(url, data=_body(2), headers=PB, timeout=30)
    assert second.status_code == 503
    assert second.headers["Retry-After"] == "1"
    assert "spool holds" in second.text
    ing.start()
    assert ing.wait_idle(60)
    third = requests.post(url, data=_body(2), headers=PB, timeout=30)  # the client's retry
    assert third.status_code == 200
    assert ing.wait_idle(60)
    ing.stop()
    spans = chdb_client.query(
        f"SELECT SpanId FROM {fresh_db}.otel_traces ORDER BY SpanId"
    ).result_rows
    assert spans == [(f"{2:016x}",), (f"{3:016x}",)]


def test_store_down_answers_503_and_replays_the_spool_later(
    chdb_client, chdb_path, fresh_db, tmp_path, serve_on
):
    # A real ClickHouse HTTP endpoint (serve's query server on this process's engine) that
    # goes down after the client connected: every later call is a refused connection.
    engine = QueryEngine(str(chdb_path), handles=1)
    qsrv = make_query_server("127.0.0.1", 0, engine, database=fresh_db)
    threading.Thread(target=qsrv.serve_forever, daemon=True).start()
    remote = clickhouse_connect.get_client(
        host="127.0.0.1", port=qsrv.server_address[1], database=fresh_db, connect_timeout=2
    )
    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir, max_bytes=1 << 30)
    ing = Ingestor(remote, fresh_db, spool)
    ing.start()
    qsrv.shutdown()
    qsrv.server_close()
    engine.close()
    url = serve_on(ing)
    assert requests.post(url, data=_body(10), headers=PB, timeout=30).status_code == 200
    deadline = time.monotonic() + 30
    while ing.health()["status"] == "ok" and time.monotonic() < deadline:
        time.sleep(0.01)
    r = requests.post(url, data=_body(11), headers=PB, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert "store is failing" in r.text
    health = requests.get(url.replace("/v1/traces", "/health"), timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "store_unavailable"
    ing._stopping.set()  # let the writer give up; the record stays in the spool
    spool.close()
    # The next start (a new Spool + Ingestor on a live store) replays it.
    spool2 = Spool(spool_dir, max_bytes=1 << 30)
    ing2 = Ingestor(chdb_client, fresh_db, spool2)
    assert ing2.start() == 1
    ing2.stop()
    rows = chdb_client.query(f"SELECT SpanId FROM {fresh_db}.otel_traces").result_rows
    assert rows == [(f"{11:016x}",)]


def test_a_batch_the_store_always_refuses_is_parked_not_lost(
    chdb_client, fresh_db, tmp_path, serve_on
):
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, max_refusals=2)
    ing.start()
    chdb_client.command(f"RENAME TABLE {fresh_db}.transition_ledger TO {fresh_db}.ledger_away")
    url = serve_on(ing)
    body = _body(20)
    assert requests.post(url, data=body, headers=PB, timeout=30).status_code == 200
    assert ing.wait_idle(60)
    h = ing.health()
    assert h["parked_batches"] == 1 and h["status"] == "ok"
    (meta,) = (tmp_path / "spool" / "dead").glob("*.json")
    assert "transition_ledger" in meta.read_text()
    assert meta.with_suffix(".body").read_bytes() == body
    chdb_client.command(f"RENAME TABLE {fresh_db}.ledger_away TO {fresh_db}.transition_ledger")
    assert requests.post(url, data=_body(21), headers=PB, timeout=30).status_code == 200
    assert ing.wait_idle(60)
    ing.stop()
    assert ing.health()["batches"] == 1


def test_the_same_request_sent_concurrently_is_stored_once(chdb_client, fresh_db, tmp_path):
    ing = Ingestor(chdb_client, fresh_db, Spool(tmp_path / "spool", max_bytes=1 << 30))
    ing.start()
    sent = []
    for r in range(3):  # whatever the writer sees together, copies of a request count once
        a, b, c = _body(40 + 3 * r), _body(41 + 3 * r), _body(42 + 3 * r)
        barrier = threading.Barrier(5)

        def send(body, barrier=barrier):
            barrier.wait()
            ing.submit(body, "protobuf", tenant="default")

        threads = [threading.Thread(target=send, args=(x,)) for x in (a, b, a, c, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sent += [41 + 3 * r, 42 + 3 * r, 43 + 3 * r]
    assert ing.wait_idle(60)
    ing.stop()
    rows = chdb_client.query(
        f"SELECT SpanId, count() FROM {fresh_db}.otel_traces GROUP BY SpanId"
    ).result_rows
    assert sorted(rows) == [(f"{i:016x}", 1) for i in sent]
    h = ing.health()
    assert (h["batches"], h["duplicate_batches"]) == (9, 6)


def test_a_full_disk_makes_the_writer_wait_not_park(
    chdb_client, chdb_path, fresh_db, tmp_path, serve_on
):
    """Below min_free_disk_bytes_to_perform_insert ClickHouse refuses inserts (code 243):
    that is an outage (503, retry), not data the store rejects (parked after max_refusals)."""
    from foundation.store import StoreSpec, connect

    spec = StoreSpec(kind="chdb", path=str(chdb_path), database=fresh_db)
    full = connect(spec, settings_={"min_free_disk_bytes_to_perform_insert": str(1 << 60)})
    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir, max_bytes=1 << 30)
    ing = Ingestor(full, fresh_db, spool, max_refusals=2)
    ing.start()
    url = serve_on(ing)
    assert requests.post(url, data=_body(20), headers=PB, timeout=30).status_code == 200
    deadline = time.monotonic() + 30
    while ing.stats["store_errors"] < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    health = ing.health()
    assert health["status"] == "store_unavailable", health
    assert "243" in health["store_error"] and "free space" in health["store_error"]
    assert health["parked_batches"] == 0 and not (spool_dir / "dead").exists()
    r = requests.post(url, data=_body(21), headers=PB, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    ing._stopping.set()
    ing.stop(timeout=5)
    spool.close()
    full.close()
    spool2 = Spool(spool_dir, max_bytes=1 << 30)  # space is back: the next start stores it
    ing2 = Ingestor(chdb_client, fresh_db, spool2)
    assert ing2.start() == 1
    ing2.stop()
    rows = chdb_client.query(f"SELECT SpanId FROM {fresh_db}.otel_traces").result_rows
    assert rows == [(f"{21:016x}",)]
