"""rejection_spike per hourly bucket against the 24 buckets before it: hand-computed
fixture with near misses, and the SQL against the plain-Python oracle on random histories.

Fixture (T0 an hour boundary, as_of 3 days later: every handoff is settled by a terminal
state; handoff i of a bucket is created at minute 5 i of it):
  search/web   hours 0-23: 5 handoffs each, 1 rejected in hours 0-11 (baseline 12/120 =
               0.1); hour 24: 10 handoffs, 3 rejected = 0.3 = 2 x 0.1 + 0.1 exactly -> spike
               (a float comparison misses it: 2 * 0.1 + 0.1 = 0.30000000000000004)
  coder/git    hours 0-47: 6 handoffs each, 3 rejected: a steady 50 % -> never a spike
  mailer/smtp  hours 0-47: 5 handoffs each, none rejected; hour 40: all 5 rejected -> spike
               (one bucket inside a 7-day window); hour 44: 4 handoffs, all rejected -> 4
               settled < 5, no spike
  triage/''    hour 40: 5 handoffs all rejected, no baseline (nothing before) -> no spike
  pager/sms    hours 0-23: 5 handoffs each, none rejected; hour 30: 2 of 5 rejected (40 %
               over a 0 % baseline) -> 2 < 3 rejected, no spike
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import Window, anomalies, anomaly_handoff_ids, rejection_spikes
from analytics.oracle import spikes as ref
from tests.analytics_seed import T, create, seed, span_rows

T0 = datetime(2026, 11, 23, tzinfo=UTC)
AS_OF = T0 + timedelta(days=3)
_tenants = itertools.count()
WEEK = Window(start=T0 - timedelta(days=4), end=T0 + timedelta(days=3), as_of=AS_OF)


def _handoff(
    h: str, at: datetime, to_agent: str, caps: list[str], rejected: bool, tenant: str = "default"
) -> list[T]:
    out = [create(h, at, task_id=f"t-{h}", to_agent=to_agent, capabilities=caps, tenant=tenant)]
    s = timedelta(seconds=1)
    if rejected:
        out.append(T(h, "reject", "created", "rejected", at + s, actor=to_agent, tenant=tenant))
    else:
        out.append(T(h, "accept", "created", "accepted", at + s, actor=to_agent, tenant=tenant))
        out.append(T(h, "cancel", "accepted", "canceled", at + 2 * s, tenant=tenant))
    return out


def _bucket(prefix: str, hour: int, to_agent: str, caps: list[str], n: int, rej: int) -> list[T]:
    start = T0 + timedelta(hours=hour)
    out: list[T] = []
    for i in range(n):
        at = start + timedelta(minutes=5 * i)
        out += _handoff(f"{prefix}{hour:02d}-{i}", at, to_agent, caps, i < rej)
    return out


def _rows() -> list[T]:
    rows: list[T] = []
    for h in range(24):
        rows += _bucket("sw", h, "search", ["web"], 5, 1 if h < 12 else 0)
    rows += _bucket("sw", 24, "search", ["web"], 10, 3)
    for h in range(48):
        rows += _bucket("cg", h, "coder", ["git"], 6, 3)
        if h != 44:
            rows += _bucket("ms", h, "mailer", ["smtp"], 5, 5 if h == 40 else 0)
    rows += _bucket("ms", 44, "mailer", ["smtp"], 4, 4)
    rows += _bucket("tr", 40, "triage", [], 5, 5)
    for h in range(24):
        rows += _bucket("ps", h, "pager", ["sms"], 5, 0)
    rows += _bucket("ps", 30, "pager", ["sms"], 5, 2)
    return rows


@pytest.fixture(scope="module")
def db(chdb_client):
    name = "t_spikes_fixture"
    from foundation.store import apply_schema

    chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")
    apply_schema(chdb_client, name)
    seed(chdb_client, name, _rows(), ledger=False)
    yield name
    chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


def test_one_hour_spike_shows_in_a_week(reader, db):
    ids = anomaly_handoff_ids(reader, database=db, window=WEEK, kind="rejection_spike")
    assert ids == [f"ms40-{i}" for i in range(5)] + [f"sw24-{i}" for i in range(3)]
    df = rejection_spikes(reader, database=db, window=WEEK)
    got = [
        (r.bucket_start, r.to_agent, r.capability, r.settled, r.rejected, r.baseline_settled,
         round(r.baseline_rate, 4), r.handoffs)
        for r in df.itertuples()
    ]  # fmt: skip
    assert got == [
        (T0 + timedelta(hours=24), "search", "web", 10, 3, 120, 0.1, 3),
        (T0 + timedelta(hours=40), "mailer", "smtp", 5, 5, 120, 0.0, 5),
    ]
    assert df["rejection_rate"].tolist() == [0.3, 1.0]
    count = anomalies(reader, database=db, window=WEEK, kinds=["rejection_spike"])
    assert int(count.iloc[0]["count"]) == 8


def test_the_hour_alone_and_a_window_cutting_the_bucket(reader, db):
    hour = Window(start=T0 + timedelta(hours=40), end=T0 + timedelta(hours=41), as_of=AS_OF)
    assert anomaly_handoff_ids(reader, database=db, window=hour, kind="rejection_spike") == [
        f"ms40-{i}" for i in range(5)
    ]
    # the bucket's verdict is the whole bucket's; the cohort keeps the handoffs from 40:12 on
    cut = Window(start=T0 + timedelta(hours=40, minutes=12), end=T0 + timedelta(hours=45), as_of=AS_OF)  # fmt: skip
    assert anomaly_handoff_ids(reader, database=db, window=cut, kind="rejection_spike") == [
        "ms40-3",
        "ms40-4",
    ]
    df = rejection_spikes(reader, database=db, window=cut)
    assert df[["to_agent", "settled", "handoffs"]].values.tolist() == [["mailer", 5, 2]]
    # the hours after the spike: nothing (hour 44 has 4 settled, below the minimum)
    after = Window(start=T0 + timedelta(hours=41), end=T0 + timedelta(hours=48), as_of=AS_OF)
    assert rejection_spikes(reader, database=db, window=after).empty


def test_bucket_and_baseline_are_parameters(reader, db):
    # daily buckets: day 1 (hours 24-47) of mailer/smtp has 9 of 119 rejected: no spike;
    # search/web's day 1 has 3 rejected of 10 against day 0's 12 of 120: a spike
    df = rejection_spikes(reader, database=db, window=WEEK, bucket_s=86400, baseline_buckets=1)
    assert df[["to_agent", "settled", "rejected", "handoffs"]].values.tolist() == [
        ["search", 10, 3, 3]
    ]
    for bad, match in (
        ({"bucket_s": 59}, "bucket_s"),
        ({"bucket_s": 7000}, "divide a day"),
        ({"bucket_s": 3600.0}, "integer"),
        ({"baseline_buckets": 0}, "baseline_buckets"),
    ):
        with pytest.raises(ValueError, match=match):
            rejection_spikes(reader, database=db, window=WEEK, **bad)


def _ref_rows(rows: list[T]) -> list[dict]:
    out = []
    for t, (ns_, trace, span, _n, _s, _a, _t) in zip(rows, span_rows(rows), strict=True):
        out.append({
            "tenant": t.tenant, "handoff_id": t.handoff_id, "event": t.event,
            "from_state": t.from_state, "to_state": t.to_state, "valid": True, "time_ns": ns_,
            "to_agent": t.attrs.get("handoff.to_agent", ""),
            "capabilities": list(t.attrs.get("handoff.capabilities", [])),
            "deadline_ms": t.attrs.get("handoff.deadline_ms"), "mode": t.attrs.get("handoff.mode", ""),
            "trace_id": trace, "span_id": span,
        })  # fmt: skip
    return out


@st.composite
def bursts(draw):
    """Two groups over 8 hourly buckets: per bucket a few handoffs, some rejected, some
    left open (unsettled unless old enough), at minutes drawn across the hour; a tenant of
    its own per example (the examples share one database)."""
    tenant = f"s{next(_tenants)}"
    rows: list[T] = []
    k = 0
    for to_agent, caps in (("search", ["web"]), ("coder", ["git", "web"])):
        for hour in range(8):
            level = draw(st.sampled_from([0, 2, 6, 10]))  # tenths rejected, roughly
            for _ in range(draw(st.integers(0, 8))):
                at = T0 + timedelta(hours=hour, minutes=draw(st.integers(0, 59)))
                fate = (
                    "rejected"
                    if draw(st.integers(0, 9)) < level
                    else draw(st.sampled_from(["done", "done", "open"]))
                )
                h = f"r{k}"
                k += 1
                if fate == "open":
                    rows.append(create(h, at, task_id=f"t-{h}", to_agent=to_agent,
                                       capabilities=caps, tenant=tenant))  # fmt: skip
                else:
                    rows += _handoff(h, at, to_agent, caps, fate == "rejected", tenant)
    start = T0 + timedelta(minutes=draw(st.sampled_from([0, 30, 150, 300])))
    end = start + timedelta(minutes=draw(st.sampled_from([45, 60, 200, 480])))
    as_of = T0 + timedelta(hours=draw(st.sampled_from([6, 9, 30])))
    baseline = draw(st.sampled_from([1, 2, 24]))
    return tenant, rows, Window(start=start, end=end, as_of=as_of), baseline


@pytest.mark.slow
@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bursts())
def test_sql_spikes_equal_the_oracle(chdb_client, fresh_db, sc):
    tenant, rows, w, baseline = sc
    if rows:
        seed(chdb_client, fresh_db, rows, ledger=False)
    kw = {
        "start_ns": int(w.start.timestamp()) * 10**9,
        "end_ns": int(w.end.timestamp()) * 10**9,
        "as_of_ns": int(w.clock().timestamp()) * 10**9,
        "baseline_buckets": baseline,
    }
    want = ref.rejection_spikes(_ref_rows(rows), **kw)
    df = rejection_spikes(
        chdb_client, database=fresh_db, window=w, tenant=tenant, baseline_buckets=baseline
    )
    got = [
        (int(r.bucket_start.timestamp()) // 3600, r.to_agent, r.capability, r.settled, r.rejected,
         r.baseline_settled, r.handoffs)
        for r in df.itertuples()
    ]  # fmt: skip
    assert got == [
        (s.bucket, s.to_agent, s.capability, s.settled, s.rejected, s.baseline_settled,
         len(s.handoffs))
        for s in want
    ]  # fmt: skip
    if baseline == 24:  # the anomaly kind uses the default baseline
        assert anomaly_handoff_ids(
            chdb_client, database=fresh_db, window=w, kind="rejection_spike", tenant=tenant
        ) == ref.rejection_spike_ids(_ref_rows(rows), **kw)


def test_cli_says_when(db, chdb_path, capsys):
    import json

    from handoffs.cli import main

    store = ["--store", f"chdb://{chdb_path}", "--database", db, "--as-of", AS_OF.isoformat()]
    span = ["--from", WEEK.start.isoformat(), "--to", WEEK.end.isoformat()]
    assert main(["anomalies", *store, *span]) == 0
    out = capsys.readouterr().out
    when = out[out.index("rejection_spike, when") :].splitlines()
    assert when[3].split() == [
        "2026-11-24",
        "00:00",
        "search",
        "web",
        "3/10",
        "30.0%",
        "10.0%",
        "3",
    ]
    assert when[4].split() == [
        "2026-11-24",
        "16:00",
        "mailer",
        "smtp",
        "5/5",
        "100.0%",
        "0.0%",
        "5",
    ]
    assert main(["anomalies", *store, *span, "--json"]) == 0
    spike = next(r for r in json.loads(capsys.readouterr().out) if r["kind"] == "rejection_spike")
    assert [(w["bucket_start"], w["handoffs"]) for w in spike["when"]] == [
        ("2026-11-24T00:00:00Z", 3),
        ("2026-11-24T16:00:00Z", 5),
    ]
    quiet = ["--from", "2026-11-25T00:00:00Z", "--to", "2026-11-26T00:00:00Z"]
    assert main(["anomalies", *store, *quiet, "--json"]) == 0
    spike = next(r for r in json.loads(capsys.readouterr().out) if r["kind"] == "rejection_spike")
    assert spike["count"] == 0 and spike["when"] == []


def test_dashboard_anomalies_page_says_when(db, chdb_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH

    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", db)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    for k, v in {"from": WEEK.start, "to": WEEK.end, "as_of": AS_OF}.items():
        at.query_params[k] = v.isoformat()
    at.run()
    at.switch_page("views/anomalies.py").run()
    assert not at.exception, [e.value for e in at.exception]
    (table,) = [d.value for d in at.dataframe if "hour" in d.value.columns]
    assert table[["hour", "to_agent", "settled", "rejected", "handoffs"]].values.tolist() == [
        ["2026-11-24 00:00 UTC", "search", 10, 3, 3],
        ["2026-11-24 16:00 UTC", "mailer", 5, 5, 5],
    ]
    assert table["rejection_rate"].tolist() == [30.0, 100.0]
