"""sql/013 and analytics._sql.settled: the state kinds from settled flags plus the live
remainder give the same anomalies as recomputing them, before a settle, after one, with rows
arriving after it (flags set and cleared), per tenant and over all, and through the
query port; the state pass read against the settle state read first (as anomalies() reads
it) gives the rows it gives when its SQL finds that state itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics import Window, anomalies
from analytics._sql.anomalies import PASSES
from analytics._sql.settled import FLAGS_TABLE, STATE_KIND_BITS, settle, settled_state_pass
from analytics._sql.watermarks import read_settled
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
W = Window(
    start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=1)
)
KINDS = PASSES["state"]


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _rows(tenant: str = "acme") -> list[T]:
    return [
        create("plain", _s(0), task_id="t-p", tenant=tenant),
        T("plain", "accept", "created", "accepted", _s(1), actor="worker", tenant=tenant),
        create("dup", _s(0), task_id="t-d", tenant=tenant),
        T("dup", "accept", "created", "accepted", _s(1), actor="worker", tenant=tenant),
        T("dup", "accept", "created", "accepted", _s(1), actor="worker", copy=1, tenant=tenant),
        create("skew", _s(10), task_id="t-s", tenant=tenant),
        T("skew", "accept", "created", "accepted", _s(5), actor="worker", tenant=tenant),
        create("wrong", _s(0), task_id="t-w", tenant=tenant),
        T("wrong", "accept", "created", "accepted", _s(1), actor="intruder", tenant=tenant),
    ]


def _pass_rows(client, db: str, window: Window, tenant: str | None) -> list[tuple]:
    sql = settled_state_pass(db, window, tenant is not None)
    params = {} if tenant is None else {"tenant": tenant}
    return sorted(client.query(f"SELECT * FROM ({sql})", parameters=params).result_rows)


def _table(client, db: str, tenant: str | None = None) -> dict[str, tuple[int, list[str]]]:
    found = _pass_rows(client, db, W, tenant)
    st = read_settled(client, db, tenant)
    assert st.flags_match
    assert _pass_rows(client, db, W.against(st), tenant) == found, st
    df = anomalies(client, database=db, window=W, examples=20, kinds=KINDS, tenant=tenant)
    return {r.kind: (int(r.count), sorted(r.examples)) for r in df.itertuples()}


def _flags(client, db: str) -> dict[tuple[str, str], int]:
    """The settled flags set, per handoff."""
    rows = client.query(
        f"SELECT tenant, handoff_id, flags FROM {db}.{FLAGS_TABLE} FINAL WHERE flags != 0"
    )
    return {(t, h): int(f) for t, h, f in rows.result_rows}


@pytest.fixture
def store(chdb_client, fresh_db) -> str:
    seed(chdb_client, fresh_db, _rows("acme") + _rows("globex"), ledger=False)
    return fresh_db


def test_settled_flags_give_the_kinds_a_recomputation_gives(chdb_client, store):
    want = _table(chdb_client, store)
    # a handoff is its tenant and id: each id twice, once per tenant (examples are ids)
    assert want["duplicate_delivery"] == (2, ["dup"])
    assert want["clock_skew"] == (2, ["skew"])
    assert want["wrong_consumer"] == (2, ["wrong"])
    assert _flags(chdb_client, store) == {}

    first = settle(chdb_client, database=store, lag_s=0)
    assert first is not None and first.since_ms == 0 and first.handoffs == 8
    assert len(_flags(chdb_client, store)) == 6
    bits = _flags(chdb_client, store)
    assert bits[("acme", "skew")] == 1 << STATE_KIND_BITS["clock_skew"]
    assert ("acme", "plain") not in bits  # an unflagged handoff costs no row
    assert _table(chdb_client, store) == want
    assert _table(chdb_client, store, "acme") == {k: (n // 2, v) for k, (n, v) in want.items()}

    # nothing touched since: the next settle recomputes and writes nothing
    marks = chdb_client.command(f"SELECT count() FROM {store}.anomaly_settle")
    assert settle(chdb_client, database=store, lag_s=0) is None
    assert chdb_client.command(f"SELECT count() FROM {store}.anomaly_settle") == marks


def test_rows_after_a_settle_set_and_clear_flags_live_and_once_settled(chdb_client, store):
    settle(chdb_client, database=store, lag_s=0)
    # the create of "skew" emitted again earlier than its accept (skew gone; a second span
    # of one transition: duplicate delivery now), and "plain" accepted a second time by
    # another actor (wrong consumer now)
    seed(
        chdb_client,
        store,
        [
            create("skew", _s(3), task_id="t-s", tenant="acme"),
            T("plain", "accept", "created", "accepted", _s(2), actor="other", tenant="acme"),
        ],
        ledger=False,
    )
    live = _table(chdb_client, store, "acme")
    assert live["clock_skew"] == (0, [])
    assert live["duplicate_delivery"] == (3, ["dup", "plain", "skew"])
    assert live["wrong_consumer"] == (2, ["plain", "wrong"])
    done = settle(chdb_client, database=store, lag_s=0)
    assert done is not None and done.handoffs == 2  # only the two touched
    assert _table(chdb_client, store, "acme") == live
    bits = _flags(chdb_client, store)
    # the settled row replaces the one before (the skew bit cleared), it is not OR-ed in;
    # the earlier create moved the handoff's created time: its row there is now 0
    assert bits[("acme", "skew")] == 1 << STATE_KIND_BITS["duplicate_delivery"]
    rows = chdb_client.query(
        f"SELECT created, flags FROM {store}.{FLAGS_TABLE} FINAL"
        " WHERE tenant = 'acme' AND handoff_id = 'skew' ORDER BY created"
    ).result_rows
    assert [(c.replace(tzinfo=UTC), f) for c, f in rows] == [
        (_s(3), 1 << STATE_KIND_BITS["duplicate_delivery"]),
        (_s(10), 0),
    ]
    assert bits[("globex", "skew")] == 1 << STATE_KIND_BITS["clock_skew"]
    assert _table(chdb_client, store)["clock_skew"] == (1, ["skew"])


def test_rows_younger_than_the_lag_stay_live(chdb_client, store):
    want = _table(chdb_client, store)
    assert settle(chdb_client, database=store, lag_s=3600) is None  # none touched an hour ago
    assert _flags(chdb_client, store) == {}
    assert chdb_client.command(f"SELECT count() FROM {store}.anomaly_settle") == 0
    assert _table(chdb_client, store) == want  # all touched after the watermark: recomputed
    with pytest.raises(ValueError, match="lag_s"):
        settle(chdb_client, database=store, lag_s=-1)


def test_the_query_port_reads_the_same_settled_flags(chdb_client, store, query_port):
    import clickhouse_connect

    # the query port (HTTP, clickhouse-connect) reads the watermark and flags as the engine does
    settle(chdb_client, database=store, lag_s=0)
    client = clickhouse_connect.get_client(host="127.0.0.1", port=query_port)
    try:
        assert _table(client, store, "globex") == _table(chdb_client, store, "globex")
        assert _table(client, store, "globex")["duplicate_delivery"] == (1, ["dup"])
    finally:
        client.close()
