"""A 72-hour outage stays visible: the simulator's planner (in-process, reduced volume) with
`--outage coder:code.write@0.25-1.0` over 4 days, its plans seeded as rows, read back.

Traffic: a task every 3 minutes for 96 hours (about 14 coder/code.write handoffs an hour),
ordinary rejects, failures and expiries at a few percent, the coder refusing code.write
(90 % of those handoffs) from hour 24 to the end. rejection_spike judges an hour against the
24 before it, so once the outage fills its baseline it goes quiet; sustained_rejections
reports the run over the whole 4-day window and over every 24-hour window inside the
outage, with its start (hour 24) and `ongoing` at the clock (the end of the traffic), and
flags exactly the handoffs the oracle (analytics.oracle.sustained) flags.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics import Window, anomaly_handoff_ids, rejection_spikes, sustained_rejections
from analytics._sql.sustained import sustained_thresholds
from analytics.oracle import sustained as ref
from collector.contract import next_state
from foundation.store import apply_schema
from handoffs.simulator import FailureRates, ScenarioConfig, SkillOutage, TaskPlan, plan_task
from tests.analytics_seed import T, create, seed
from tests.integration._reference_rows import reference_rows

T0 = datetime(2026, 11, 23, tzinfo=UTC)
END = T0 + timedelta(hours=96)
S = 10**9
OUTAGE_START = T0 + timedelta(hours=24)
RATES = FailureRates.parse("reject=0.03,fail=0.03,expire=0.02", base=FailureRates.none())


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * S


def _at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // S, UTC) + timedelta(microseconds=ns % S // 1000)


def _transitions(plan: TaskPlan) -> list[T]:
    """A plan's steps as seeded rows (every step is legal with these rates)."""
    env = {h.handoff_id: h.envelope for h in plan.handoffs}
    state: dict[str, str] = {}
    out: list[T] = []
    for s in plan.steps:
        hid, at = s.handoff_id, _at(s.at_ns)
        if s.event == "create":
            e = env[hid]
            out.append(create(hid, at, task_id=plan.task_id, mode=e["mode"],
                              from_agent=e["from_agent"], to_agent=e["to_agent"],
                              topology=plan.topology, deadline_ms=e["deadline_ms"],
                              capabilities=e["capabilities"], tenant=plan.tenant))  # fmt: skip
            state[hid] = "created"
            continue
        to = next_state(state[hid], s.event).value
        code = s.attrs.get("error_code")
        attrs = {"handoff.error_code": code} if code else {}
        out.append(T(hid, s.event, state[hid], to, at, actor=s.actor, tenant=plan.tenant,
                     attrs=attrs))  # fmt: skip
        state[hid] = to
    return out


@pytest.fixture(scope="module")
def outage(chdb_client):
    outage = SkillOutage.from_spec("coder:code.write@0.25-1.0", _ns(T0), _ns(END))
    cfg = ScenarioConfig(seed=11, tenants={"acme": 1.0}, rates=RATES, outage=outage)
    rows = [
        t
        for i in range(96 * 20)
        for t in _transitions(plan_task(cfg, i, _ns(T0) + i * 180 * S))
        if t.at < END  # what happened by the clock
    ]
    db = "t_long_outage"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    apply_schema(chdb_client, db)
    seed(chdb_client, db, rows, ledger=False)
    yield db, reference_rows(rows)
    chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def _check(client, db: str, refrows: list[dict], w: Window) -> None:
    """The coder's run is reported whole in `w`, and the kind flags what the oracle does."""
    runs = sustained_rejections(client, database=db, window=w)
    coder = runs[(runs["to_agent"] == "coder") & (runs["capability"] == "code.write")]
    assert coder[["start", "end", "ongoing", "hours"]].values.tolist() == [
        [OUTAGE_START, None, True, 72]
    ], w
    assert coder["rejection_rate"].item() > 0.85
    got = anomaly_handoff_ids(client, database=db, window=w, kind="sustained_rejections",
                              limit=100_000)  # fmt: skip
    kw = {"start_ns": _ns(w.start), "end_ns": _ns(w.end), "as_of_ns": _ns(END)}
    want = [h for _t, h in ref.sustained_ids(refrows, th=sustained_thresholds(), **kw)]
    assert got == want and len(got) >= coder["handoffs"].item() > 200, w


def test_the_whole_four_days(chdb_client, outage):
    db, refrows = outage
    _check(chdb_client, db, refrows, Window(start=T0, end=END, as_of=END))


def test_every_day_inside_the_outage_while_the_spike_goes_quiet(chdb_client, outage):
    db, refrows = outage
    spiked = {}
    for h in range(24, 73, 6):
        day = Window(start=T0 + timedelta(hours=h), end=T0 + timedelta(hours=h + 24), as_of=END)
        _check(chdb_client, db, refrows, day)
        spikes = rejection_spikes(chdb_client, database=db, window=day)
        coder = spikes[(spikes["to_agent"] == "coder") & (spikes["capability"] == "code.write")]
        spiked[h] = sorted(
            {int((b - OUTAGE_START).total_seconds()) // 3600 for b in coder["bucket_start"]}
        )
    # the outage is its own baseline within hours: rejection_spike fires in its first 12
    # hours (counted from the outage's start), then says nothing for the days after
    assert spiked[24] and max(spiked[24]) < 12, spiked
    assert all(not hours for h, hours in spiked.items() if h >= 36), spiked
