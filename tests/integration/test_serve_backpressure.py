"""503 + Retry-After instead of accept-then-drop: a full spool, a store that is down, a
spool already closed.

In-process: a real Ingestor + OTLP server on the session's chDB, or on a real
clickhouse-connect HTTP client aimed at a port where nothing listens (the store is down).
"""

from __future__ import annotations

import threading
import time

import clickhouse_connect
import pytest
import requests

from ingest import Ingestor, Spool, verify_chain
from ingest.testing import request_protobuf, span_json, transition
from serve._query_http import QueryEngine, make_query_server
from tests.integration._backends import Observed, Refusing

PB = {"Content-Type": "application/x-protobuf"}


def _body(i: int) -> bytes:
    s = span_json(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        attributes=transition(f"h-{i}", "create", "", "created"),
        start_ns=time.time_ns(),
    )
    return request_protobuf([s])


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


def test_a_request_after_the_spool_closed_answers_503(chdb_client, fresh_db, tmp_path, serve_on):
    """A keep-alive connection may still send a request after shutdown closed the spool: it
    is refused, for the sender to retry elsewhere or later, never written nor acknowledged."""
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    ing = Ingestor(chdb_client, fresh_db, spool)
    url = serve_on(ing)
    spool.close()
    r = requests.post(url, data=_body(1), headers=PB, timeout=30)
    assert r.status_code == 503 and "spool closed" in r.text
    assert r.headers["Retry-After"] == "1"
    assert ing.health()["queued"] == 0


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
    writer = Observed(remote, fresh_db)
    ing = Ingestor(remote, fresh_db, spool, backend=writer)
    ing.start()
    qsrv.shutdown()
    qsrv.server_close()
    engine.close()
    url = serve_on(ing)
    assert requests.post(url, data=_body(10), headers=PB, timeout=30).status_code == 200
    assert writer.wait_failures(2)  # the first failure is recorded: the store is failing
    r = requests.post(url, data=_body(11), headers=PB, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert "store is failing" in r.text
    health = requests.get(url.replace("/v1/traces", "/health"), timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "store_unavailable"
    assert not ing.stop(timeout=10)  # the writer gives up; the record stays in the spool
    spool.close()
    # The next start (a new Spool + Ingestor on a live store) replays it.
    spool2 = Spool(spool_dir, max_bytes=1 << 30)
    ing2 = Ingestor(chdb_client, fresh_db, spool2)
    assert ing2.start() == 1
    ing2.stop()
    rows = chdb_client.query(f"SELECT SpanId FROM {fresh_db}.otel_traces").result_rows
    assert rows == [(f"{11:016x}",)]


def _ledger_matches(client, db: str, spans: int, batches: int) -> None:
    """Every span stored once, one ledger row per span, and the chain verifies."""
    got = client.query(f"SELECT count(), uniqExact(SpanId) FROM {db}.otel_traces").result_rows
    ledger = client.query(f"SELECT count(), uniqExact(span_id) FROM {db}.transition_ledger")
    assert got == [(spans, spans)] and ledger.result_rows == [(spans, spans)]
    report = verify_chain(client, db)
    assert report.ok and report.batches == batches, report


def test_a_store_that_cannot_write_for_a_while_is_back_pressure_not_poison(
    chdb_client, fresh_db, tmp_path, serve_on
):
    """The ledger table away (UNKNOWN_TABLE) after the spans went in, many more times than
    max_refusals: 503 + Retry-After meanwhile, nothing parked, and once the table is back
    the batch is stored once with its ledger rows and chain row."""
    writer = Observed(chdb_client, fresh_db)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, max_refusals=2, backend=writer)
    ing.start()
    chdb_client.command(f"RENAME TABLE {fresh_db}.transition_ledger TO {fresh_db}.ledger_away")
    url = serve_on(ing)
    assert requests.post(url, data=_body(20), headers=PB, timeout=30).status_code == 200
    assert writer.wait_failures(5)
    h = ing.health()
    assert h["parked_batches"] == 0 and h["status"] == "store_unavailable", h
    assert not (tmp_path / "spool" / "dead").exists()
    r = requests.post(url, data=_body(21), headers=PB, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    chdb_client.command(f"RENAME TABLE {fresh_db}.ledger_away TO {fresh_db}.transition_ledger")
    assert ing.wait_idle(60)
    assert requests.post(url, data=_body(21), headers=PB, timeout=30).status_code == 200
    assert ing.wait_idle(60)
    assert ing.stop()
    assert ing.health()["parked_batches"] == 0
    _ledger_matches(chdb_client, fresh_db, spans=2, batches=2)


@pytest.mark.parametrize(
    "code", [164, 497, 76, 1000, 999_999], ids=["readonly", "denied", "open", "poco", "unknown"]
)
def test_refusals_that_are_not_about_the_data_are_retried_never_parked(
    chdb_client, fresh_db, tmp_path, code
):
    """A store that refuses writes with a read-only / permission / I/O / unknown error many
    more times than max_refusals, then takes them: nothing parked, everything stored once."""
    writer = Refusing(chdb_client, fresh_db, code, times=6)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, max_refusals=2, backend=writer)
    ing.start()
    ing.submit(_body(30), "protobuf", tenant="default")
    assert writer.wait_failures(3)
    assert ing.health()["status"] == "store_unavailable"
    assert ing.wait_idle(60) and ing.stop()
    h = ing.health()
    assert (h["parked_batches"], h["store_errors"], h["status"]) == (0, 6, "ok")
    assert not (tmp_path / "spool" / "dead").exists()
    _ledger_matches(chdb_client, fresh_db, spans=1, batches=1)


def test_a_batch_the_store_always_refuses_is_parked_not_lost(
    chdb_client, fresh_db, tmp_path, serve_on
):
    """Data the store refuses every time (TYPE_MISMATCH), none of it visible: parked in
    spool/dead after max_refusals, counted, and the requests after it flow."""
    writer = Refusing(chdb_client, fresh_db, 53, times=2)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, max_refusals=2, backend=writer)
    ing.start()
    url = serve_on(ing)
    body = _body(20)
    assert requests.post(url, data=body, headers=PB, timeout=30).status_code == 200
    assert ing.wait_idle(60)
    h = ing.health()
    assert h["parked_batches"] == 1 and h["status"] == "ok"
    (meta,) = (tmp_path / "spool" / "dead").glob("*.json")
    assert "Code: 53" in meta.read_text()
    assert meta.with_suffix(".body").read_bytes() == body
    assert requests.post(url, data=_body(21), headers=PB, timeout=30).status_code == 200
    assert ing.wait_idle(60)
    assert ing.stop()
    assert ing.health()["batches"] == 1
    _ledger_matches(chdb_client, fresh_db, spans=1, batches=1)


def test_refused_data_of_which_some_is_visible_is_never_parked(chdb_client, fresh_db, tmp_path):
    """A data error after part of the group went in: parking it would leave rows in
    otel_traces with no ingest_batches row. It is retried instead, and stored once."""
    writer = Refusing(chdb_client, fresh_db, 53, times=4, after_data=True)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, max_refusals=2, backend=writer)
    ing.start()
    ing.submit(_body(40), "protobuf", tenant="default")
    assert ing.wait_idle(60) and ing.stop()
    h = ing.health()
    assert (h["parked_batches"], h["store_errors"], h["batches"]) == (0, 4, 1)
    assert not (tmp_path / "spool" / "dead").exists()
    _ledger_matches(chdb_client, fresh_db, spans=1, batches=1)


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
    writer = Observed(full, fresh_db)
    ing = Ingestor(full, fresh_db, spool, max_refusals=2, backend=writer)
    ing.start()
    url = serve_on(ing)
    assert requests.post(url, data=_body(20), headers=PB, timeout=30).status_code == 200
    assert writer.wait_failures(5)
    health = ing.health()
    assert health["status"] == "store_unavailable", health
    assert "243" in health["store_error"] and "free space" in health["store_error"]
    assert health["parked_batches"] == 0 and not (spool_dir / "dead").exists()
    r = requests.post(url, data=_body(21), headers=PB, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert not ing.stop(timeout=5)  # a failing write is not retried once stopping
    spool.close()
    full.close()
    spool2 = Spool(spool_dir, max_bytes=1 << 30)  # space is back: the next start stores it
    ing2 = Ingestor(chdb_client, fresh_db, spool2)
    assert ing2.start() == 1
    ing2.stop()
    rows = chdb_client.query(f"SELECT SpanId FROM {fresh_db}.otel_traces").result_rows
    assert rows == [(f"{21:016x}",)]
