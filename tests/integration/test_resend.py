"""A transport resend (the same span: same trace and span id, time and content, stored again
from another request) counts once everywhere and is no duplicate delivery; a redelivery as a
new span still is, and so is one span id stored at another time.

Spans go in through the ingest functions serve uses (ingest_requests: decode, validate,
write_batch with its ledger rows and batch chain), or through tests.analytics_seed, and are
read back by the public analytics loaders.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics import Window, anomalies, evidence_package, funnel, verify_package
from ingest import ingest_requests, verify_chain
from ingest.testing import request_json, span_json, transition
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))
T0_NS = int(T0.timestamp()) * 10**9
TRACE = "ab" * 16


def _span(
    i: int,
    event: str,
    frm: str,
    to: str,
    *,
    hid: str = "h1",
    at: int | None = None,
    **extra: Any,
) -> dict:
    """Span i of handoff `hid`: span id i, `at` (default i) seconds after T0."""
    attrs = transition(hid, event, frm, to, task_id=f"t-{hid}", **extra)
    start = T0_NS + (i if at is None else at) * 10**9
    return span_json(trace_id=TRACE, span_id=f"{i:016x}", start_ns=start, attributes=attrs)


def _body(spans: list[dict]) -> tuple[str, bytes, str]:
    return ("json", json.dumps(request_json(spans)).encode(), "test")


def _flagged(client, db: str) -> dict[str, list[str]]:
    df = anomalies(client, database=db, window=WINDOW, examples=10)
    return {r.kind: list(r.examples) for r in df.itertuples() if r.count}


def _arrivals(pkg: dict) -> list[tuple[str, str, int]]:
    return [(t["event"], t["span_id"], t["arrivals"]) for t in pkg["transitions"]]


@pytest.fixture
def resent(chdb_client, fresh_db):
    """h1: create, accept, start, commit in one request; the commit again, unchanged, in a
    second request with the verify (a collector re-sending part of a batch whose answer was
    lost); and the first request again byte for byte (an exporter's retry)."""
    ev: dict[str, Any] = {"handoff__evidence__count": 1, "handoff__evidence__valid": True}
    commit = _span(4, "commit", "running", "committed", **ev)
    first = [_span(1, "create", "", "created"), _span(2, "accept", "created", "accepted"),
             _span(3, "start", "accepted", "running"), commit]  # fmt: skip
    second = [commit, _span(5, "verify", "committed", "verified")]
    summary = ingest_requests(
        chdb_client, fresh_db, [_body(first), _body(second), _body(first)], source="test"
    )
    # the identical body is recognised and not stored again; the other is stored in full
    assert (summary.requests, summary.stored, summary.duplicates) == (3, 6, 4)
    stored = chdb_client.query(
        f"SELECT count(), uniqExact(ingest_batch) FROM {fresh_db}.handoff_transitions "
        "WHERE span_id = {s:String}",
        parameters={"s": commit["spanId"]},
    ).result_rows[0]
    assert stored == (2, 2)  # the resent commit is stored twice, from two batches
    return fresh_db, commit["spanId"]


def test_a_span_resent_in_another_batch_counts_once(chdb_client, resent):
    db, commit_span = resent
    row = funnel(chdb_client, database=db, window=WINDOW).iloc[0]
    assert (row["volume"], row["settled"], row["committed"], row["p_e2e"]) == (1, 1, 1, 1.0)
    assert _flagged(chdb_client, db) == {}  # no duplicate_delivery, nor anything else

    pkg = evidence_package(chdb_client, database=db, handoff_id="h1", as_of=WINDOW.as_of)
    assert pkg is not None
    assert _arrivals(pkg) == [("create", f"{1:016x}", 1), ("accept", f"{2:016x}", 1),
                              ("start", f"{3:016x}", 1), ("commit", commit_span, 2),
                              ("verify", f"{5:016x}", 1)]  # fmt: skip
    assert pkg["anomalies"] == []
    integ = pkg["integrity"]
    assert len(integ["chain"]) == 5
    # every stored row, both copies of the commit included, matches its ledger entry
    assert integ["ledger"] == {"rows": 6, "matched": 6, "mismatched": [], "missing": [],
                               "ok": True}  # fmt: skip
    assert verify_package(chdb_client, pkg, database=db).ok
    assert verify_chain(chdb_client, db).ok


def test_each_copy_of_a_resent_span_is_still_verified(chdb_client, resent):
    db, commit_span = resent
    pkg = evidence_package(chdb_client, database=db, handoff_id="h1")
    assert pkg is not None
    batches = [
        b
        for (b,) in chdb_client.query(
            f"SELECT ingest_batch FROM {db}.handoff_transitions WHERE span_id = {{s:String}} "
            "ORDER BY ingest_batch",
            parameters={"s": commit_span},
        ).result_rows
    ]
    # one copy rewritten after ingest: the package made before names the span, and so does
    # one made after, which lists the two contents apart
    chdb_client.command(
        f"ALTER TABLE {db}.handoff_transitions UPDATE actor = 'mallory' "
        "WHERE span_id = {s:String} AND ingest_batch = {b:String}",
        parameters={"s": commit_span, "b": batches[1]},
        settings={"mutations_sync": 2},
    )
    res = verify_package(chdb_client, pkg, database=db)
    assert not res.ok and all(commit_span in p for p in res.problems)
    assert f"span_id={commit_span}: stored row differs from the package (column actor)" in (
        res.problems
    )
    later = evidence_package(chdb_client, database=db, handoff_id="h1")
    assert later is not None
    commits = [t for t in later["transitions"] if t["span_id"] == commit_span]
    assert sorted((t["actor"], t["arrivals"]) for t in commits) == [("agent-b", 1), ("mallory", 1)]
    assert later["integrity"]["ledger"]["mismatched"] == [commit_span]
    assert later["integrity"]["ledger"]["matched"] == 5
    assert not verify_package(chdb_client, later, database=db).ok


def test_a_deleted_copy_is_named(chdb_client, resent):
    db, commit_span = resent
    pkg = evidence_package(chdb_client, database=db, handoff_id="h1")
    assert pkg is not None
    (batch,) = chdb_client.query(
        f"SELECT max(ingest_batch) FROM {db}.handoff_transitions WHERE span_id = {{s:String}}",
        parameters={"s": commit_span},
    ).result_rows[0]
    chdb_client.command(
        f"ALTER TABLE {db}.handoff_transitions DELETE "
        "WHERE span_id = {s:String} AND ingest_batch = {b:String}",
        parameters={"s": commit_span, "b": batch},
        settings={"mutations_sync": 2},
    )
    assert verify_package(chdb_client, pkg, database=db).problems == [
        f"span_id={commit_span}: stored 1 times, the package recorded 2 arrivals "
        "(a copy added or deleted after export)"
    ]


def test_a_redelivery_as_a_new_span_is_still_a_duplicate(chdb_client, fresh_db):
    # the shim's redeliver(): the same transition emitted again as a NEW span (copy=1 gives
    # it another span id), here at the same time as the first
    seed(chdb_client, fresh_db, [create("h1", T0, task_id="t1"),
                                 T("h1", "accept", "created", "accepted", T0 + timedelta(seconds=1)),
                                 T("h1", "accept", "created", "accepted", T0 + timedelta(seconds=1),
                                   copy=1)])  # fmt: skip
    assert _flagged(chdb_client, fresh_db)["duplicate_delivery"] == ["h1"]
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="h1", as_of=WINDOW.as_of)
    assert pkg is not None
    accepts = [(e, n) for e, _s, n in _arrivals(pkg) if e == "accept"]
    assert accepts == [("accept", 1), ("accept", 1)]  # two spans, each stored once
    assert "duplicate_delivery" in pkg["anomalies"]
    assert verify_package(chdb_client, pkg, database=fresh_db).ok


def test_one_span_id_with_other_content(chdb_client, fresh_db):
    """The same span ids with other content, from a second request. Same transition and time
    (h1, the evidence flag changed): one span for duplicate_delivery, both contents folded
    into the funnel (the copy without evidence decides V) and listed in the package.
    Another time (h3): a re-emission, a duplicate delivery. Another transition (h2): two
    transitions, both counted (a fork out of `created`: invalid)."""
    ev: dict[str, Any] = {"handoff__evidence__count": 1}
    first = [_span(1, "create", "", "created"), _span(2, "accept", "created", "accepted"),
             _span(3, "start", "accepted", "running"),
             _span(4, "commit", "running", "committed", **ev, handoff__evidence__valid=True),
             _span(11, "create", "", "created", hid="h2"),
             _span(12, "accept", "created", "accepted", hid="h2"),
             _span(21, "create", "", "created", hid="h3"),
             _span(22, "accept", "created", "accepted", hid="h3")]  # fmt: skip
    second = [_span(4, "commit", "running", "committed", **ev, handoff__evidence__valid=False),
              _span(12, "reject", "created", "rejected", hid="h2"),
              _span(22, "accept", "created", "accepted", hid="h3", at=25)]  # fmt: skip
    ingest_requests(chdb_client, fresh_db, [_body(first), _body(second)], source="test")
    flagged = _flagged(chdb_client, fresh_db)
    assert flagged["duplicate_delivery"] == ["h3"]
    assert flagged["committed_without_evidence"] == ["h1"]
    assert flagged["invalid_transition"] == ["h2"]
    row = funnel(chdb_client, database=fresh_db, window=WINDOW).iloc[0]
    assert (row["volume"], row["executed"], row["evidenced"], row["committed"]) == (3, 1, 0, 0)
    for hid, span in (("h1", f"{4:016x}"), ("h2", f"{12:016x}"), ("h3", f"{22:016x}")):
        pkg = evidence_package(chdb_client, database=fresh_db, handoff_id=hid, as_of=WINDOW.as_of)
        assert pkg is not None
        same = [t for t in pkg["transitions"] if t["span_id"] == span]
        assert len(same) == 2 and len({t["row_hash"] for t in same}) == 2, hid
        assert [t["arrivals"] for t in same] == [1, 1], hid
        assert ("duplicate_delivery" in pkg["anomalies"]) == (hid == "h3"), hid
        assert pkg["integrity"]["ledger"]["ok"], hid
        assert verify_package(chdb_client, pkg, database=fresh_db).ok, hid
