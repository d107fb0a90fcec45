"""sql/009 handoff_anomaly_state: the file is generated from its module, the kinds it feeds
come out of one row per handoff, and a store that held transitions before the table
existed is backfilled when the schema is applied, to the same anomalies as a store whose
view saw every insert (and running the backfill again changes nothing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics import Window, anomalies
from analytics._sql.anomaly_state import render_state_ddl
from foundation.store import SQL_DIR, apply_schema, schema_statements
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
W = Window(
    start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=1)
)
FILE = "009_handoff_anomaly_state.sql"
#: the file that adds to the table (its `touched` column): a store from before 009 lacks it
LATER = "013_settled_flags.sql"


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _rows() -> list[T]:
    """One or two handoffs per kind the state table feeds, plus a plain one."""
    slot: dict[str, Any] = {"task_id": "t-r", "to_agent": "worker", "idempotency_key": "k-r"}
    grant: dict[str, Any] = {
        "handoff.grant.capabilities": ["search"],
        "handoff.grant.tenant": "elsewhere",
        "handoff.grant.expires_at": "2026-11-20T09:00:01Z",
    }
    retries_a1: dict[str, Any] = {"handoff.retry_of": "a1"}
    consumes_a1: dict[str, Any] = {"handoff.causation_id": "a1"}
    rows = [
        create("plain", _s(0), task_id="t-p"),
        T("plain", "accept", "created", "accepted", _s(1), actor="worker"),
        # duplicate delivery: the accept as a second span; and the same span resent
        create("dup", _s(0), task_id="t-d"),
        T("dup", "accept", "created", "accepted", _s(1), actor="worker"),
        T("dup", "accept", "created", "accepted", _s(1), actor="worker", copy=1),
        # clock skew: the accept stamped before the create it follows
        create("skew", _s(10), task_id="t-s"),
        T("skew", "accept", "created", "accepted", _s(5), actor="worker"),
        # envelope: an intruder accepts, a tenant claim, a grant exceeded and expired
        create(
            "env",
            _s(0),
            task_id="t-e",
            capabilities=["search", "write"],
            **grant,
        ),
        T("env", "accept", "created", "accepted", _s(1), actor="intruder"),
        T(
            "env",
            "start",
            "accepted",
            "running",
            _s(5),
            actor="worker",
            attrs={"handoff.tenant": "evil"},
        ),
        # retry: a1 unknown, b1 retries it; both commit with one key (duplicate execution)
        create("a1", _s(0), **slot),
        T("a1", "accept", "created", "accepted", _s(1), actor="worker", task_id="t-r"),
        T("a1", "start", "accepted", "running", _s(2), actor="worker", task_id="t-r"),
        T("a1", "timeout", "running", "unknown", _s(3), task_id="t-r"),
        T(
            "a1",
            "resolve_committed",
            "unknown",
            "committed",
            _s(30),
            task_id="t-r",
            attrs={"handoff.receipt.expires_at": "2026-11-20T09:00:40Z"},
        ),
        create("b1", _s(10), **slot, **retries_a1),
        T("b1", "accept", "created", "accepted", _s(11), actor="worker", task_id="t-r"),
        T("b1", "start", "accepted", "running", _s(12), actor="worker", task_id="t-r"),
        T("b1", "commit", "running", "committed", _s(40), actor="worker", task_id="t-r"),
        # causation: c1 consumes a1 before any verify, c2 after its receipt expired
        create("c1", _s(35), task_id="t-c", **consumes_a1),
        create("c2", _s(50), task_id="t-c", **consumes_a1),
        # idempotency: one key, two payloads
        create("i1", _s(0), task_id="t-i", idempotency_key="k-i", payload_hash="p1"),
        create("i2", _s(5), task_id="t-i", idempotency_key="k-i", payload_hash="p2"),
        # stale fence: f2 commits with a lower token than f1 did earlier in the task
        create("f1", _s(0), task_id="t-f"),
        T(
            "f1",
            "commit",
            "running",
            "committed",
            _s(20),
            actor="worker",
            task_id="t-f",
            attrs={"handoff.fence_token": 7},
        ),
        create("f2", _s(1), task_id="t-f"),
        T(
            "f2",
            "commit",
            "running",
            "committed",
            _s(30),
            actor="worker",
            task_id="t-f",
            attrs={"handoff.fence_token": 3},
        ),
    ]
    return rows


EXPECTED = {
    "duplicate_delivery": ["dup"],
    "clock_skew": ["skew"],
    "wrong_consumer": ["env"],
    "grant_expired": ["env"],
    "capability_outside_grant": ["env"],
    "grant_tenant_mismatch": ["env"],
    "tenant_claim_mismatch": ["env"],
    "blind_retry": ["b1"],
    "duplicate_execution": ["b1"],
    "consumed_before_verified": ["c1", "c2"],
    "expired_receipt_used": ["c2"],
    "idempotency_conflict": ["i1", "i2"],
    "stale_fence": ["f2"],
}


def _table(client, db: str, kinds=tuple(EXPECTED)) -> dict[str, tuple[int, list[str]]]:
    df = anomalies(client, database=db, window=W, examples=20, kinds=kinds)
    return {r.kind: (int(r.count), sorted(r.examples)) for r in df.itertuples()}


def test_the_ddl_file_is_generated_from_its_module():
    assert (SQL_DIR / FILE).read_text() == render_state_ddl(), (
        f"sql/{FILE} is stale: run `python -m analytics._sql.anomaly_state > sql/{FILE}`"
    )
    names = [n for n, _s in schema_statements("x")]
    assert names.count(FILE) == 3  # the table, its view, the backfill


@pytest.fixture
def live(chdb_client, fresh_db) -> str:
    seed(chdb_client, fresh_db, _rows(), ledger=False)
    seed(chdb_client, fresh_db, [_rows()[3]], ledger=False)  # a span resent later
    return fresh_db


def test_each_state_kind_flags_its_handoffs_and_a_resend_changes_nothing(chdb_client, live):
    got = _table(chdb_client, live)
    for kind, ids in EXPECTED.items():
        assert got[kind] == (len(ids), ids), kind


def test_a_store_from_before_the_table_is_backfilled_to_the_same_anomalies(
    chdb_client, live, fresh_db
):
    # a store as it was before sql/009: the same rows, no state table, 009 and 013 not
    # recorded (the settle tables 013 makes are left: IF NOT EXISTS)
    old = f"{fresh_db}_old"
    apply_schema(chdb_client, old)
    chdb_client.command(f"DROP VIEW {old}.handoff_anomaly_state_mv SYNC")
    chdb_client.command(f"DROP TABLE {old}.handoff_anomaly_state SYNC")
    chdb_client.command(
        f"ALTER TABLE {old}.schema_version DELETE WHERE file IN ('{FILE}', '{LATER}')"
        " SETTINGS mutations_sync = 2"
    )
    try:
        seed(chdb_client, old, _rows(), ledger=False)
        seed(chdb_client, old, [_rows()[3]], ledger=False)
        assert apply_schema(chdb_client, old) == [FILE, LATER]
        assert _table(chdb_client, old, None) == _table(chdb_client, live, None)  # every kind
        want = _table(chdb_client, live)
        assert all(want[k][0] > 0 for k in EXPECTED)
        # the backfill again (a crash after it, the file applied a second time): no change
        backfill = [s for n, s in schema_statements(old) if n == FILE][-1]
        assert backfill.startswith("INSERT INTO")
        chdb_client.command(backfill)
        assert _table(chdb_client, old) == want
        # and a new row after the backfill reaches the table through the view
        seed(chdb_client, old, [T("skew", "start", "accepted", "running", _s(2), actor="worker")])
        assert _table(chdb_client, old)["clock_skew"] == (1, ["skew"])
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {old} SYNC")
