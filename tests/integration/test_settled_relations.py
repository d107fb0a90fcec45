"""sql/015 and analytics._sql.settled_relations: bounce, blind retry and duplicate execution from
settled flags plus the live remainder give the rows recomputing them gives, per tenant and
over all, when rows arrive after a settle for a handoff other than the one whose kind they
change (a transfer between two of a task's, the attempt a retry names leaving unknown, a
key-mate committing first); the next settle rewrites the untouched handoff's flags."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics import Window, anomalies
from analytics._sql.settled import settle
from analytics._sql.settled_relations import (
    RELATION_KIND_BITS,
    RELATION_PASSES,
    settled_relation_pass,
)
from analytics._sql.watermarks import RELATION_FLAGS_TABLE, read_settled
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
W = Window(
    start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=1)
)
KINDS = ("bounce", "blind_retry", "duplicate_execution")
TENANTS = ("acme", "globex")


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _transfer(hid: str, at: float, src: str, dst: str, tenant: str, task: str = "t-b") -> T:
    return create(
        hid, _s(at), task_id=task, mode="transfer", from_agent=src, to_agent=dst, tenant=tenant
    )


def _rows(tenant: str) -> list[T]:
    slot: dict[str, Any] = {"task_id": "t-r", "to_agent": "worker", "tenant": tenant}
    retries_r1: dict[str, Any] = {"handoff.retry_of": "r1"}
    return [
        # task t-b: x1 a->b then x3 b->a (x3 a bounce); task t-y: y1 a->b then y3 a->c (none)
        _transfer("x1", 0, "a", "b", tenant),
        _transfer("x3", 20, "b", "a", tenant),
        _transfer("y1", 0, "a", "b", tenant, "t-y"),
        _transfer("y3", 20, "a", "c", tenant, "t-y"),
        # r1 unknown from 3 s; r2 names it as the attempt it retries, created at 10 s: blind
        create("r1", _s(0), **slot),
        T("r1", "timeout", "running", "unknown", _s(3), task_id="t-r", tenant=tenant),
        create("r2", _s(10), **slot, **retries_r1),
        # one key: d2 commits at 15 s, d1 not yet
        create("d1", _s(0), task_id="t-d", idempotency_key="k-d", tenant=tenant),
        create("d2", _s(1), task_id="t-d", idempotency_key="k-d", tenant=tenant),
        T("d2", "commit", "running", "committed", _s(15), task_id="t-d", tenant=tenant),
    ]


def _later(tenant: str) -> list[T]:
    """Rows each for a handoff other than the one whose kind they change."""
    return [
        # x2 c->d between x1 and x3: x3 no longer follows a transfer it hands back
        _transfer("x2", 10, "c", "d", tenant),
        # y2 c->a between y1 and y3: y3 (a->c) now hands y2 straight back
        _transfer("y2", 10, "c", "a", tenant, "t-y"),
        # r1 resolved at 8 s, before r2 was created: r2 no longer blind
        T("r1", "resolve_committed", "unknown", "committed", _s(8), task_id="t-r", tenant=tenant),
        # d1 commits at 5 s, before d2: d2 the later of two committing attempts
        T("d1", "commit", "running", "committed", _s(5), task_id="t-d", tenant=tenant),
    ]


def _pass_rows(client, db: str, window: Window, tenant: str | None) -> dict[str, list[tuple]]:
    """kind -> (tenant, handoff_id) flagged, from each relation pass."""
    params = {} if tenant is None else {"tenant": tenant}
    found: dict[str, list[tuple]] = {k: [] for k in KINDS}
    for name, (kinds, _build) in RELATION_PASSES.items():
        sql = settled_relation_pass(name, db, window, tenant is not None)
        rows = client.query(f"SELECT * FROM ({sql})", parameters=params).result_rows
        for t, h, *bits in rows:
            for kind, bit in zip(kinds, bits, strict=True):
                if bit:
                    found[kind].append((t, h))
    return {k: sorted(set(v)) for k, v in found.items()}


def _kinds(client, db: str, tenant: str | None = None) -> dict[str, list[tuple]]:
    """The relation kinds read against the settle state, asserted equal to recomputing them
    (the window with no settle state) and to anomalies()' counts and examples."""
    st = read_settled(client, db, tenant)
    got = _pass_rows(client, db, W.against(st), tenant)
    assert got == _pass_rows(client, db, W, tenant), st
    df = anomalies(client, database=db, window=W, examples=20, kinds=KINDS, tenant=tenant)
    table = {r.kind: (int(r.count), sorted(r.examples)) for r in df.itertuples()}
    for kind in KINDS:
        want = (len(got[kind]), sorted({h for _t, h in got[kind]}))
        assert table.get(kind, (0, [])) == want, kind
    return got


def _flags(client, db: str) -> dict[tuple[str, str], int]:
    rows = client.query(
        f"SELECT tenant, handoff_id, flags FROM {db}.{RELATION_FLAGS_TABLE} FINAL WHERE flags != 0"
    )
    return {(t, h): int(f) for t, h, f in rows.result_rows}


def _bit(kind: str) -> int:
    return 1 << RELATION_KIND_BITS[kind]


@pytest.fixture
def store(chdb_client, fresh_db) -> str:
    seed(chdb_client, fresh_db, [r for t in TENANTS for r in _rows(t)], ledger=False)
    return fresh_db


def test_settled_relation_flags_give_the_kinds_a_recomputation_gives(chdb_client, store):
    before = _kinds(chdb_client, store)
    assert before == {
        "bounce": [(t, "x3") for t in TENANTS],
        "blind_retry": [(t, "r2") for t in TENANTS],
        "duplicate_execution": [],
    }
    assert _flags(chdb_client, store) == {}
    assert settle(chdb_client, database=store, lag_s=0) is not None
    st = read_settled(chdb_client, store, None)
    assert st.relations_match and st.live == 0
    assert _flags(chdb_client, store) == {
        **{(t, "x3"): _bit("bounce") for t in TENANTS},
        **{(t, "r2"): _bit("blind_retry") for t in TENANTS},
    }
    assert _kinds(chdb_client, store) == before
    assert _kinds(chdb_client, store, "globex") == {
        k: [(t, h) for t, h in v if t == "globex"] for k, v in before.items()
    }


@pytest.mark.parametrize("tenant", ["acme", None])
def test_rows_for_a_related_handoff_change_an_untouched_ones_kinds(chdb_client, store, tenant):
    settle(chdb_client, database=store, lag_s=0)
    seed(chdb_client, store, _later("acme"), ledger=False)
    # live: x3, r2 and d2 were not touched, their kinds changed through x2, y2, r1 and d1
    live = _kinds(chdb_client, store, tenant)
    acme = {
        "bounce": [("acme", "y3")],
        "blind_retry": [],
        "duplicate_execution": [("acme", "d2")],
    }
    globex = {"bounce": [("globex", "x3")], "blind_retry": [("globex", "r2")]}
    want = acme if tenant else {k: sorted(v + globex.get(k, [])) for k, v in acme.items()}
    assert live == want
    done = settle(chdb_client, database=store, lag_s=0)
    assert done is not None and done.handoffs == 4  # x2, y2, r1, d1: only the touched
    assert read_settled(chdb_client, store, tenant).live == 0
    assert _kinds(chdb_client, store, tenant) == live
    # the untouched handoffs' flags were rewritten (x3's and r2's replaced by 0), globex's kept
    assert _flags(chdb_client, store) == {
        ("acme", "y3"): _bit("bounce"),
        ("acme", "d2"): _bit("duplicate_execution"),
        ("globex", "x3"): _bit("bounce"),
        ("globex", "r2"): _bit("blind_retry"),
    }
