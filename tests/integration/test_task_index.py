"""sql/005 handoff_tasks: the view fills it, the evidence package finds the task's other
handoffs through it, and backfill_task_index() rebuilds it for a store created before 005."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from analytics import Window, anomalies, backfill_task_index, evidence_package
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def _bounce() -> list[T]:
    # a transfer A->B, then B hands it straight back B->A in the same task: a bounce
    return [
        create("hx1", s(0), task_id="tb", mode="transfer", from_agent="A", to_agent="B"),
        T("hx1", "accept", "created", "accepted", s(1)),
        create("hx2", s(10), task_id="tb", mode="transfer", from_agent="B", to_agent="A"),
        create("hy1", s(20), task_id="other"),
    ]


def test_view_fills_index_and_evidence_uses_it(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _bounce(), ledger=False)
    pairs = chdb_client.query(
        f"SELECT DISTINCT task_id, handoff_id FROM {fresh_db}.handoff_tasks ORDER BY handoff_id"
    ).result_rows
    assert pairs == [("tb", "hx1"), ("tb", "hx2"), ("other", "hy1")]
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="hx2", as_of=s(3600))
    assert pkg is not None
    assert "bounce" in pkg["anomalies"]
    df = anomalies(chdb_client, database=fresh_db, window=WINDOW, examples=3)
    assert df.set_index("kind").loc["bounce", "examples"] == ["hx2"]


def test_backfill_rebuilds_an_emptied_index_idempotently(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _bounce(), ledger=False)
    chdb_client.command(f"TRUNCATE TABLE {fresh_db}.handoff_tasks")
    # without the index the package cannot see the task's other handoff
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="hx2", as_of=s(3600))
    assert pkg is not None
    assert "bounce" not in pkg["anomalies"]
    assert backfill_task_index(chdb_client, database=fresh_db) == 3
    assert backfill_task_index(chdb_client, database=fresh_db) == 3  # again: no new pairs
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="hx2", as_of=s(3600))
    assert pkg is not None
    assert "bounce" in pkg["anomalies"]
