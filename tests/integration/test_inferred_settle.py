"""A blind retry inferred from the task, agents and objective is a relation kind: its flag is
kept by the settle job, and rows of the retried attempt that arrive later change it. Here A's
resolution, stored after B was settled as a blind retry, shows A's outcome was known before
B was sent: B is no blind retry, both while A is live (recomputed with the handoffs related
to it) and after the next settle (A's task's handoffs are settled again with it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from analytics import Window, anomalies, settle
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
W = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))
OH: dict[str, Any] = {"handoff.objective.hash": "sha256:refund-10"}


def at(sec: float) -> datetime:
    return T0 + timedelta(seconds=sec)


def _blind(client, db: str) -> list[str]:
    """As the pages read it: against the settled state (the flags and the live handoffs)."""
    df = anomalies(client, database=db, window=W, kinds=["blind_retry"], examples=10)
    return sorted(df.iloc[0]["examples"])


def test_a_late_resolution_of_the_first_attempt_clears_the_inferred_blind_retry(
    chdb_client, fresh_db
):
    seed(chdb_client, fresh_db, [
        create("a", at(0), task_id="t", idempotency_key="k-1", **OH),
        T("a", "timeout", "created", "unknown", at(30), task_id="t", actor="planner"),
        create("b", at(60), task_id="t", idempotency_key="k-2", **OH),
    ])  # fmt: skip
    settle(chdb_client, database=fresh_db, lag_s=0)
    assert _blind(chdb_client, fresh_db) == ["b"]
    # a's resolution (at 45 s, before b was created) is stored only now
    seed(chdb_client, fresh_db, [
        T("a", "resolve_failed", "unknown", "failed", at(45), task_id="t", actor="worker"),
    ])  # fmt: skip
    assert _blind(chdb_client, fresh_db) == []  # a is live: b recomputed with it
    settle(chdb_client, database=fresh_db, lag_s=0)
    assert _blind(chdb_client, fresh_db) == []  # settled again with a's task
