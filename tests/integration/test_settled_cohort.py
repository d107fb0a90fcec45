"""sql/014 and analytics._sql.cohort.cohort_sql: the funnel and the cohort passes read the
settled copy of each handoff's summary (handoff_settled, ordered by created time) for the
handoffs settled before the copy's watermark and handoff_summary for the rest, and give the
same numbers as reading handoff_summary alone: before a settle, after one, with rows
arriving after it (a created time moved, a handoff committed), per tenant and over all, and
on a store whose flags were settled before the copy existed."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from analytics import Window, anomalies, funnel
from analytics._sql.cohort import cohort_sql
from analytics._sql.inferred_policy import policy
from analytics._sql.settled import settle
from analytics._sql.watermarks import (
    COHORT_COLUMNS,
    COHORT_TABLE,
    COHORT_WATERMARK_TABLE,
    FLAGS_TABLE,
    Settled,
    read_settled,
)
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
CLOCK = T0 + timedelta(hours=1)
W = Window(start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=CLOCK)
#: two windows that split the handoffs created at 3 s from those created at 10 s
EARLY = Window(start=T0, end=T0 + timedelta(seconds=5), as_of=CLOCK)
LATE = Window(start=T0 + timedelta(seconds=5), end=T0 + timedelta(minutes=1), as_of=CLOCK)
BY = ("pair", "mode", "capability")


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _rows(tenant: str) -> list[T]:
    return [
        create("plain", _s(0), task_id="t-p", tenant=tenant, capabilities=["read"]),
        T("plain", "accept", "created", "accepted", _s(1), actor="worker", tenant=tenant),
        create("moved", _s(10), task_id="t-m", tenant=tenant, mode="transfer"),
        T("moved", "accept", "created", "accepted", _s(11), actor="worker", tenant=tenant),
        T("moved", "start", "accepted", "running", _s(12), actor="worker", tenant=tenant),
        create("open", _s(2), task_id="t-o", tenant=tenant, to_agent="critic"),
    ]


def _numbers(client, db: str, tenant: str | None = None) -> dict[str, list[dict]]:
    """What a reader sees of the cohort: funnels (whole, sliced, two narrow windows) and the
    cohort-reading anomaly passes."""

    def recs(df) -> list[dict]:
        return df.round(9).fillna(-1).to_dict("records")  # NaN != NaN

    return {
        "funnel": recs(funnel(client, database=db, window=W, tenant=tenant)),
        "slices": recs(funnel(client, database=db, window=W, by=BY, tenant=tenant)),
        "early": recs(funnel(client, database=db, window=EARLY, tenant=tenant)),
        "late": recs(funnel(client, database=db, window=LATE, tenant=tenant)),
        "anomalies": recs(
            anomalies(client, database=db, window=W, tenant=tenant, examples=10).drop(
                columns=["examples"]
            )
        ),
    }


def _cohort(client, db: str, tenant: str | None = None) -> list[tuple]:
    """The cohort's rows, read with the settle state found by the SQL itself, and the same
    with it read first (the shells' way): both must be equal."""
    sql = cohort_sql(db, W, tenant_param=tenant is not None)
    params = {} if tenant is None else {"tenant": tenant}
    found = client.query(f"SELECT * FROM ({sql}) ORDER BY tenant, handoff_id", parameters=params)
    settled = read_settled(client, db, tenant)
    # the state as read, and each source it could choose on a bigger store or none settled
    for st in {
        settled,
        Settled(settled.watermark_ms, settled.live, 10**9),
        Settled(0, 0),
    }:
        sql = cohort_sql(db, W.against(st), tenant_param=tenant is not None)
        read = client.query(f"SELECT * FROM ({sql}) ORDER BY tenant, handoff_id", parameters=params)
        assert found.result_rows == read.result_rows, st
    return found.result_rows


def _copy(client, db: str, handoff: str) -> list[tuple[datetime, int]]:
    rows = client.query(
        f"SELECT created, alive FROM {db}.{COHORT_TABLE} FINAL"
        f" WHERE tenant = 'acme' AND handoff_id = '{handoff}' ORDER BY created"
    ).result_rows
    return [(c.replace(tzinfo=UTC), a) for c, a in rows]


@pytest.fixture
def store(chdb_client, fresh_db) -> str:
    seed(chdb_client, fresh_db, _rows("acme") + _rows("globex"), ledger=False)
    return fresh_db


def test_the_copy_holds_every_summary_column(chdb_client, fresh_db):
    def columns(table: str) -> list[tuple[str, str]]:
        return chdb_client.query(
            f"SELECT name, type FROM system.columns WHERE database = '{fresh_db}'"
            f" AND table = '{table}' ORDER BY position"
        ).result_rows

    # the summary's columns with their stored types (a SimpleAggregateFunction's argument;
    # created is never null in the copy: only handoffs with a create are copied)
    bare = [
        (n, "DateTime64(9, 'UTC')" if n == "created" else re.sub(r"^SimpleAggregateFunction\(\w+, (.*)\)$", r"\1", t))
        for n, t in columns("handoff_summary")
    ]  # fmt: skip
    assert [n for n, _t in bare] == list(COHORT_COLUMNS)
    assert columns(COHORT_TABLE) == [*bare, ("alive", "UInt8"), ("version", "UInt64")]


def test_a_settled_cohort_gives_what_the_summary_gives(chdb_client, store):
    want = _numbers(chdb_client, store)
    assert want["funnel"][0]["volume"] == 6
    assert want["early"][0]["volume"] == 4 and want["late"][0]["volume"] == 2
    acme = _numbers(chdb_client, store, "acme")
    rows = _cohort(chdb_client, store)
    assert read_settled(chdb_client, store, None) == Settled(
        0, 0, flags_ms=0, relations_ms=0, audits_ms=0
    )

    done = settle(chdb_client, database=store, lag_s=0)
    assert done is not None and done.handoffs == 6
    assert chdb_client.command(f"SELECT count() FROM {store}.{COHORT_TABLE} FINAL") == 6
    window_s = policy().keyless_window_s
    assert read_settled(chdb_client, store, "acme") == Settled(
        done.until_ms, 0, 6, done.until_ms, done.until_ms, done.until_ms, window_s
    )
    assert _numbers(chdb_client, store) == want
    assert _numbers(chdb_client, store, "acme") == acme
    assert _cohort(chdb_client, store) == rows


def test_rows_after_a_settle_are_read_live_and_the_next_settle_moves_the_copy(chdb_client, store):
    settle(chdb_client, database=store, lag_s=0)
    assert _copy(chdb_client, store, "moved") == [(_s(10), 1)]
    # "moved" gets an earlier create (its created time moves from 10 s to 3 s, out of LATE
    # into EARLY) and goes on to commit; "open" is accepted
    seed(
        chdb_client,
        store,
        [
            create("moved", _s(3), task_id="t-m", tenant="acme", mode="transfer"),
            T("moved", "prepare", "running", "prepared", _s(13), actor="worker", tenant="acme"),
            T("moved", "commit", "prepared", "committed", _s(14), actor="worker", tenant="acme"),
            T("open", "accept", "created", "accepted", _s(4), actor="critic", tenant="acme"),
        ],
        ledger=False,
    )
    live = _numbers(chdb_client, store, "acme")
    assert read_settled(chdb_client, store, "acme").live == 2
    assert read_settled(chdb_client, store, "globex").source == "copy"
    rows = _cohort(chdb_client, store)
    assert rows == sorted(rows) and len(rows) == 6
    assert live["early"][0]["volume"] == 3 and live["late"][0]["volume"] == 0
    assert live["funnel"][0]["accepted"] == 3  # 2 when settled: "open" read live
    both = _numbers(chdb_client, store)
    assert both["late"][0]["volume"] == 1  # globex's "moved" stays where it was

    again = settle(chdb_client, database=store, lag_s=0)
    assert again is not None and again.handoffs == 2  # only the two touched
    assert _numbers(chdb_client, store, "acme") == live
    assert _numbers(chdb_client, store) == both
    assert _cohort(chdb_client, store) == rows
    # the copy at the old created time is no longer the handoff's
    assert _copy(chdb_client, store, "moved") == [(_s(3), 1), (_s(10), 0)]


def test_a_store_settled_before_the_copy_reads_the_summary_until_it_is_copied(chdb_client, store):
    want = _numbers(chdb_client, store)
    first = settle(chdb_client, database=store, lag_s=0)
    assert first is not None
    # as a store whose flags were settled before sql/014: no copy, no copy watermark
    chdb_client.command(f"TRUNCATE TABLE {store}.{COHORT_TABLE}")
    chdb_client.command(f"TRUNCATE TABLE {store}.{COHORT_WATERMARK_TABLE}")
    st = read_settled(chdb_client, store, None)
    assert st == Settled(
        0, 0, flags_ms=first.until_ms, relations_ms=first.until_ms, audits_ms=first.until_ms
    )
    assert not st.flags_match and not st.relations_match
    assert _numbers(chdb_client, store) == want
    rows = _cohort(chdb_client, store)
    # the next settle starts from the copy's watermark (none): every handoff is copied
    done = settle(chdb_client, database=store, lag_s=0)
    assert done is not None and done.since_ms == 0 and done.handoffs == 6
    assert chdb_client.command(f"SELECT count() FROM {store}.{COHORT_TABLE} FINAL") == 6
    assert _numbers(chdb_client, store) == want
    assert _cohort(chdb_client, store) == rows


def _settled_rows(client, db: str) -> dict[str, list[tuple]]:
    return {
        t: client.query(
            f"SELECT * EXCEPT version FROM {db}.{t} FINAL ORDER BY tenant, handoff_id, created"
        ).result_rows
        for t in (COHORT_TABLE, FLAGS_TABLE)
    }


def test_a_settle_in_key_range_slices_writes_what_one_slice_writes(chdb_client, store, fresh_db):
    want = _numbers(chdb_client, store)
    progress: list[tuple[int, int]] = []
    done = settle(
        chdb_client, database=store, lag_s=0, keys_per_slice=2,
        progress=lambda i, n: progress.append((i, n)),
    )  # fmt: skip
    assert done is not None and done.handoffs == 6
    assert progress[-1][0] == progress[-1][1] > 1  # several slices, each reported
    sliced = _settled_rows(chdb_client, store)
    assert len(sliced[COHORT_TABLE]) == 6
    assert _numbers(chdb_client, store) == want
    # the same store settled in one slice (after a copy of the rows) holds the same rows
    chdb_client.command(f"DROP DATABASE IF EXISTS {fresh_db}_one SYNC")
    from foundation.store import apply_schema

    apply_schema(chdb_client, f"{fresh_db}_one")
    try:
        chdb_client.command(
            f"INSERT INTO {fresh_db}_one.otel_traces SELECT * FROM {store}.otel_traces"
        )
        assert settle(chdb_client, database=f"{fresh_db}_one", lag_s=0) is not None
        assert _settled_rows(chdb_client, f"{fresh_db}_one") == sliced
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {fresh_db}_one SYNC")
    with pytest.raises(ValueError, match="keys_per_slice"):
        settle(chdb_client, database=store, keys_per_slice=0)
