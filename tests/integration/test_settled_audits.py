"""sql/018 and analytics._sql.settled_audits: the contract checks read from settled bits give what
recomputing them gives. Every kind's fixture (tests/integration/_kind_fixtures.py, each in its
own tenant) is seeded into two databases; one is never settled (every pass recomputed), the
other is settled, in one go or between two inserts (rows of a settled handoff arriving later:
the handoff and those related to it recomputed live, then settled again). A query whose
settings or clock ask for more than a settle kept (a longer keyless window, grants required
after a settle that did not require them, an ack judged at an earlier clock) gets the
recomputed answer too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from analytics import anomalies, funnel, settle
from analytics._sql.settled_audits import AUDIT_PASSES
from analytics._sql.watermarks import AUDIT_FLAGS_TABLE, read_settled
from collector import semconv as sc
from foundation.store import apply_schema
from tests.analytics_seed import T, create, seed
from tests.integration._kind_fixtures import T0, WINDOW, fixtures, variants

#: the audit flags' kinds, and the idempotency conflict the relation flags keep since sql/018
KINDS = [k for p in AUDIT_PASSES.values() for k in p.kinds] + ["idempotency_conflict"]


def _rows() -> list[T]:
    out = [r for f in fixtures().values() for r in f.rows]
    out += [r for _k, f in variants().values() for r in f.rows]
    # an ack asked within 60 s and never given: missing from 60 s on, by the query's clock
    ack: dict[str, Any] = {sc.MESSAGE_REQUIRES_ACK: True, sc.MESSAGE_TTL_S: 60}
    out.append(create("ack-open", T0, task_id="t-ack", tenant="acks", **ack))
    # keyless writes 120 s apart: a duplicate for a window of 600 s, not for one of 60 s
    cmd: dict[str, Any] = {"payload_hash": "pk-wide", sc.MESSAGE_KIND: "command"}
    for i, sec in enumerate((0, 120)):
        h = f"wide-{i}"
        task: dict[str, Any] = {"task_id": f"t-wide-{i}", "tenant": "wide", "actor": "worker"}
        out += [
            create(h, T0 + timedelta(seconds=sec), task_id=f"t-wide-{i}", tenant="wide", **cmd),
            T(h, "accept", "created", "accepted", T0 + timedelta(seconds=sec + 1), **task),
            T(h, "start", "accepted", "running", T0 + timedelta(seconds=sec + 2), **task),
            T(h, "commit", "running", "committed", T0 + timedelta(seconds=sec + 3), **task),
        ]
    return out


def _table(client, db: str, window=WINDOW) -> dict:
    df = anomalies(client, database=db, window=window, kinds=KINDS, examples=1000)
    f = funnel(client, database=db, window=window).iloc[0]
    table: dict[str, tuple[Any, Any]] = {
        r.kind: (r.count, sorted(r.examples)) for r in df.itertuples()
    }
    table["funnel"] = (int(f["evidenced"]), int(f["evidence_claimed"]))
    return table


@pytest.fixture
def dbs(chdb_client) -> Iterator[tuple[str, ...]]:
    names = tuple(f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    for n in names:
        apply_schema(chdb_client, n)
    yield names
    for n in names:
        chdb_client.command(f"DROP DATABASE IF EXISTS {n} SYNC")


def _flags(client, db: str) -> int:
    return int(
        client.command(f"SELECT count() FROM {db}.{AUDIT_FLAGS_TABLE} FINAL WHERE flags != 0")
    )


def test_settled_audit_kinds_equal_the_recomputation(chdb_client, dbs, monkeypatch):
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")
    live, settled = dbs
    rows = _rows()
    seed(chdb_client, live, rows, ledger=False)
    seed(chdb_client, settled, rows, ledger=False)
    want = _table(chdb_client, live)
    assert all(want[k][0] > 0 for k in KINDS), want  # every kind fires here
    assert settle(chdb_client, database=settled, lag_s=0) is not None
    assert read_settled(chdb_client, settled, None).audits_match
    assert _flags(chdb_client, settled) > 0  # the bits are read, not recomputed
    assert _table(chdb_client, settled) == want
    # an earlier clock: the open ack is not missing yet, by the query's clock
    early = WINDOW.__class__(WINDOW.start, WINDOW.end, as_of=T0 + timedelta(seconds=30))
    assert _table(chdb_client, settled, early) == _table(chdb_client, live, early)


def test_rows_after_a_settle_are_read_live_then_settled_again(chdb_client, dbs, monkeypatch):
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")
    live, settled = dbs
    rows = _rows()
    seed(chdb_client, live, rows, ledger=False)
    want = _table(chdb_client, live)
    # every second row first: a refusal before its retry, a commit before its create, ...
    seed(chdb_client, settled, rows[::2], ledger=False)
    settle(chdb_client, database=settled, lag_s=0)
    seed(chdb_client, settled, rows[1::2], ledger=False)
    assert read_settled(chdb_client, settled, None).live > 0
    assert _table(chdb_client, settled) == want  # the late rows' handoffs recomputed
    again = settle(chdb_client, database=settled, lag_s=0)
    assert again is not None and read_settled(chdb_client, settled, None).live == 0
    assert _table(chdb_client, settled) == want


def test_a_query_asking_more_than_the_settle_kept_recomputes(chdb_client, dbs, monkeypatch):
    live, settled = dbs
    rows = _rows()
    seed(chdb_client, live, rows, ledger=False)
    seed(chdb_client, settled, rows, ledger=False)
    # settled with a 60 s keyless window and no grants required
    monkeypatch.setenv("HANDOFFS_KEYLESS_WINDOW_S", "60")
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "0")
    settle(chdb_client, database=settled, lag_s=0)
    st = read_settled(chdb_client, settled, None)
    assert (st.audits_keyless_s, st.audits_grants) == (60, False)
    narrow = _table(chdb_client, settled)
    assert narrow == _table(chdb_client, live)
    assert "wide-1" not in narrow["keyless_duplicate_write"][1]
    assert narrow["missing_grant"] == (0, [])
    # a query with the default 600 s window and grants required
    monkeypatch.setenv("HANDOFFS_KEYLESS_WINDOW_S", "600")
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")
    wide = _table(chdb_client, settled)
    assert wide == _table(chdb_client, live)
    assert "wide-1" in wide["keyless_duplicate_write"][1]
    assert wide["missing_grant"][0] > 0


def test_a_handoff_settled_again_for_a_relation_keeps_its_other_bits(chdb_client, fresh_db):
    # x overran its tool budget; a, of x's task, is refused only later: the next settle
    # recomputes x's refusal kind (a is its task's) but not its budget, which x keeps
    slot: dict[str, Any] = {"task_id": "t-c", "tenant": "keep"}
    budget_1: dict[str, Any] = {sc.MAX_TOOL_CALLS: 1}
    x = [
        create("x", T0 + timedelta(seconds=5), **slot, **budget_1),
        T("x", "accept", "created", "accepted", T0 + timedelta(seconds=6), actor="worker", **slot),
        T("x", "start", "accepted", "running", T0 + timedelta(seconds=7), actor="worker", **slot),
        T("x", "commit", "running", "committed", T0 + timedelta(seconds=8), actor="worker",
          attrs={sc.TOOL_CALLS: 4}, **slot),
    ]  # fmt: skip
    seed(chdb_client, fresh_db, [create("a", T0, **slot), *x], ledger=False)
    settle(chdb_client, database=fresh_db, lag_s=0)
    budget = anomalies(
        chdb_client, database=fresh_db, window=WINDOW, kinds=["tool_budget_exceeded"]
    )
    assert list(budget.iloc[0]["examples"]) == ["x"]
    seed(chdb_client, fresh_db, [
        T("a", "reject", "created", "rejected", T0 + timedelta(seconds=1), actor="worker",
          attrs={sc.ERROR_CODE: "busy"}, **slot),
    ], ledger=False)  # fmt: skip
    again = settle(chdb_client, database=fresh_db, lag_s=0)
    assert again is not None and again.handoffs == 1  # a alone was touched
    budget = anomalies(
        chdb_client, database=fresh_db, window=WINDOW, kinds=["tool_budget_exceeded"]
    )
    assert list(budget.iloc[0]["examples"]) == ["x"]
