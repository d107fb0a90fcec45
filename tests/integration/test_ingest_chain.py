"""The ingest hash chain verifies when intact and names the batch when something changed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import requests

from ingest import ingest_requests, verify_chain
from ingest.testing import create_spans, request_protobuf
from serve.testing import wait_until


def _requests(n: int):
    return [("protobuf", request_protobuf(create_spans(k, 3)), f"request {k}") for k in range(n)]


@pytest.fixture
def chained(chdb_client, fresh_db):
    ingest_requests(chdb_client, fresh_db, _requests(4), source="test")
    report = verify_chain(chdb_client, fresh_db)
    assert report.ok and report.batches == 4 and len(report.heads) == 1, report
    return fresh_db


def _mutate(client, sql: str) -> None:
    client.command(sql, settings={"mutations_sync": 2})


def test_a_rewritten_ledger_row_is_named(chdb_client, chained):
    db = chained
    (bid,) = chdb_client.query(f"SELECT any(ingest_batch) FROM {db}.transition_ledger").result_rows[
        0
    ]
    _mutate(
        chdb_client,
        f"ALTER TABLE {db}.transition_ledger UPDATE row_hash = repeat('a', 64) "
        f"WHERE ingest_batch = '{bid}' AND span_id = (SELECT min(span_id) FROM {db}.transition_ledger "
        f"WHERE ingest_batch = '{bid}')",
    )
    report = verify_chain(chdb_client, db)
    assert report.problems == (f"batch {bid}: its ledger row hashes changed (batch_hash differs)",)


def test_every_stored_row_is_checked_against_its_ledger_entry_page_by_page(chdb_client, chained):
    from ingest._verify import verify_rows

    db = chained
    for page in (1, 2, 5, 20_000):  # pages end on handoff boundaries; one handoff = 1 row here
        rep = verify_rows(chdb_client, db, page=page)
        assert rep.rows == 12 and rep.problems == (), page
    (span,) = chdb_client.query(f"SELECT min(span_id) FROM {db}.handoff_transitions").result_rows[0]
    _mutate(chdb_client, f"ALTER TABLE {db}.handoff_transitions DELETE WHERE span_id = '{span}'")
    (other,) = chdb_client.query(f"SELECT max(span_id) FROM {db}.handoff_transitions").result_rows[
        0
    ]
    _mutate(
        chdb_client,
        f"ALTER TABLE {db}.handoff_transitions UPDATE actor = 'x' WHERE span_id = '{other}'",
    )
    for page in (1, 3, 20_000):
        rep = verify_rows(chdb_client, db, page=page)
        assert rep.rows == 11 and len(rep.problems) == 2, (page, rep)
        assert any(span in p and "without their stored row" in p for p in rep.problems)
        assert any(other in p and "does not match its ledger entry" in p for p in rep.problems)


def test_a_row_of_a_batch_no_ingest_batches_row_names_is_reported(chdb_client, chained):
    """A row copied in under a batch serve never acknowledged is not taken for one written
    during the check: once the check's wait for it runs out, it is named."""
    from ingest._verify import verify_rows

    db = chained
    chdb_client.command(
        f"INSERT INTO {db}.handoff_transitions SELECT * REPLACE ('forged' AS ingest_batch) "
        f"FROM {db}.handoff_transitions ORDER BY span_id LIMIT 1"
    )
    (span,) = chdb_client.query(f"SELECT min(span_id) FROM {db}.handoff_transitions").result_rows[0]
    rep = verify_rows(chdb_client, db, settle_s=0.3)
    assert rep.rows == 13 and rep.late_rows == 0
    assert len(rep.problems) == 1
    assert f"span {span} (tenant default): stored without a ledger entry" in rep.problems[0]


def test_rows_of_batches_stored_during_the_check_are_left_out_not_reported():
    from ingest._verify import late_batches

    meanwhile, unknown = late_batches(frozenset({"b2", "b3", "x"}), frozenset({"b1", "b2", "b3"}))
    assert meanwhile == {"b2", "b3"} and unknown == {"x"}
    assert late_batches(frozenset(), frozenset({"b1"})) == (frozenset(), frozenset())


def test_ledger_verify_of_a_store_taking_spans_says_intact(start_serve):
    """serve keeps storing while `ledger verify` reads: rows and ledger entries of batches
    stored during the check are left out of it (and counted), never reported as deleted."""
    serve = start_serve()
    stop = threading.Event()
    sent = [0]

    def send() -> None:
        k = 1000
        while not stop.is_set():
            r = requests.post(
                f"{serve.otlp_url}/v1/traces",
                data=request_protobuf(create_spans(k, 3)),
                headers={"Content-Type": "application/x-protobuf"},
                timeout=30,
            )
            assert r.status_code == 200
            k += 1
            sent[0] += 1

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        wait_until(lambda: sent[0] >= 20, 60, "20 requests stored")
        from ingest._verify import verify_ledger

        with serve.client() as client:
            for _ in range(3):  # read through the query port while serve writes
                report = verify_ledger(client, serve.database)
                assert report.ok, report.problems[:5]
    finally:
        stop.set()
        sender.join(timeout=60)
    serve.wait_stored()
    out = subprocess.run(
        [sys.executable, "-m", "handoffs", "ledger", "verify", "--store", serve.query_url, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["ok"] and report["rows"]["late_rows"] == 0
    assert report["rows"]["checked"] == 3 * sent[0]


def test_a_deleted_batch_breaks_the_chain(chdb_client, chained):
    db = chained
    first = chdb_client.query(
        f"SELECT ingest_batch FROM {db}.ingest_batches WHERE prev_chain_hash = repeat('0', 64)"
    ).result_rows[0][0]
    _mutate(chdb_client, f"ALTER TABLE {db}.ingest_batches DELETE WHERE ingest_batch = '{first}'")
    report = verify_chain(chdb_client, db)
    assert not report.ok
    assert any("follows a chain link no batch has" in p for p in report.problems)
    assert f"ledger rows of batch {first} with no ingest_batches row" in report.problems


def test_cli_over_serves_query_port(start_serve):
    serve = start_serve()
    for _fmt, body, _ in _requests(3):
        r = requests.post(
            f"{serve.otlp_url}/v1/traces",
            data=body,
            headers={"Content-Type": "application/x-protobuf"},
            timeout=30,
        )
        assert r.status_code == 200
    serve.wait_stored()
    for command in (["ledger", "verify"], ["verify-chain"]):  # the second: its former name
        out = subprocess.run(
            [sys.executable, "-m", "handoffs", *command, "--store", serve.query_url, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["ok"] and report["batches"] >= 1 and len(report["heads"]) == 1
        # serve runs without a signing key here: the log is there, unsigned, and says so
        assert report["log"]["leaves"] == 9 and report["log"]["signed_heads"] == 0
        assert report["log"]["notes"] == ["signatures not checked (no public key given)",
                                          "no signed heads: the log's 9 leaves are unsigned"]  # fmt: skip
