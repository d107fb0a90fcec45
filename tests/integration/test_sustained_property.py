"""Property: sustained_rejections (the runs report and the anomaly pass) and consumer_stalled
equal their plain-Python oracle (analytics.oracle.sustained) on random histories.

Histories: two (to_agent, capability) groups over ten hours, each hour a drawn number of
handoffs at a drawn rejection level (around the 50 % rate and the 5-settled minimum; some
left open, settled only once old enough), a handoff of one group listing two capabilities;
and shared-queue messages on two queues for two consumers (drawn offsets, ties included,
or none; accepted with a consumed and head offset, rejected, expired, canceled, or left
waiting; some of another topology), with clocks around the 300 s stall threshold. Windows
cut hours; the clock is drawn before, inside and long after the data; the report's
thresholds are drawn too (the pass uses the settings' defaults). Each example seeds its own tenant in one database.
Derandomized, so a failure replays.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import Window, anomaly_handoff_ids, sustained_rejections
from analytics._sql.sustained import SustainedThresholds, sustained_thresholds
from analytics.oracle import sustained as ref
from tests.analytics_seed import T, create, seed
from tests.integration._reference_rows import reference_rows

T0 = datetime(2026, 11, 23, tzinfo=UTC)
_tenants = itertools.count()
_NS = 1_000_000_000


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * _NS


@st.composite
def hours_of_rejections(draw, tenant: str) -> list[T]:
    rows: list[T] = []
    k = 0
    for to_agent, caps in (("coder", ["write"]), ("search", ["web"])):
        for hour in range(10):
            level = draw(st.sampled_from([0, 4, 5, 6, 10]))  # tenths rejected, roughly
            for _ in range(draw(st.sampled_from([0, 3, 4, 5, 6, 8]))):
                at = T0 + timedelta(hours=hour, minutes=draw(st.integers(0, 59)))
                h, k = f"r{k}", k + 1
                two = draw(st.integers(0, 9)) == 0  # listed under both capabilities
                env = create(h, at, task_id=f"t-{h}", to_agent=to_agent, tenant=tenant,
                             capabilities=[*caps, "web"] if two else caps)  # fmt: skip
                rows.append(env)
                s = timedelta(seconds=1)
                if draw(st.integers(0, 9)) < level:
                    rows.append(T(h, "reject", "created", "rejected", at + s, actor=to_agent,
                                  tenant=tenant, attrs={"handoff.error_code": "busy"}))  # fmt: skip
                elif draw(st.sampled_from(["done", "done", "open"])) == "done":
                    rows.append(T(h, "accept", "created", "accepted", at + s, actor=to_agent,
                                  tenant=tenant))  # fmt: skip
                    rows.append(T(h, "cancel", "accepted", "canceled", at + 2 * s, tenant=tenant))
    return rows


@st.composite
def queue_messages(draw, tenant: str) -> list[T]:
    rows: list[T] = []
    for k in range(draw(st.sampled_from([6, 0, 3, 10]))):
        h = f"q{k}"
        # a message a minute, give or take: the 300 s threshold falls among them
        at = T0 + timedelta(hours=1, seconds=60 * k + draw(st.sampled_from([0, 30, -90])))
        queue = draw(st.sampled_from(["jobs", "jobs", "mail"]))
        consumer = draw(st.sampled_from(["billing", "ledger"]))
        topology = draw(st.sampled_from(["shared_queue", "shared_queue", "in_process"]))
        offset = draw(st.sampled_from([k, 7, k, None]))  # mostly growing, ties and none too
        where = (
            {} if offset is None else {"handoff.queue.name": queue, "handoff.queue.offset": offset}
        )
        rows.append(create(h, at, task_id=f"t-{h}", to_agent=consumer, topology=topology,
                           tenant=tenant, **where))  # fmt: skip
        fate = draw(
            st.sampled_from(["wait", "accept", "expire", "accept", "reject", "wait", "cancel"])
        )
        later = at + timedelta(seconds=draw(st.sampled_from([5, 120, 600])))
        if fate == "accept":
            off = draw(st.sampled_from([k, 7, 12, None]))
            head = draw(st.sampled_from([15, 7, None]))
            pos = {"handoff.queue.name": queue}
            pos |= {} if off is None else {"handoff.queue.offset": off}
            pos |= {} if head is None else {"handoff.queue.head_offset": max(head, off or 0)}
            rows.append(T(h, "accept", "created", "accepted", later, actor=consumer,
                          tenant=tenant, attrs=pos))  # fmt: skip
        elif fate == "reject":
            rows.append(T(h, "reject", "created", "rejected", later, actor=consumer, tenant=tenant))
        elif fate in ("expire", "cancel"):  # the queue gave up on it; the sender withdrew it
            to = "expired" if fate == "expire" else "canceled"
            rows.append(T(h, fate, "created", to, later, actor="planner", tenant=tenant))
    return rows


@st.composite
def scenario(draw):
    tenant = f"u{next(_tenants)}"
    rows = draw(hours_of_rejections(tenant)) + draw(queue_messages(tenant))
    start = T0 + timedelta(minutes=draw(st.sampled_from([60, 0, 90, 240])))
    end = start + timedelta(hours=draw(st.sampled_from([1, 2, 5, 11])))
    as_of = T0 + timedelta(minutes=draw(st.sampled_from([70, 64, 190, 660, 1800])))
    th = SustainedThresholds(
        rate=Fraction(draw(st.sampled_from([1, 3, 5])), 10)
        if draw(st.booleans())
        else Fraction(1, 2),
        min_settled=draw(st.sampled_from([3, 5])),
        hours=draw(st.sampled_from([1, 2, 3])),
    )
    return tenant, rows, Window(start=start, end=end, as_of=as_of), th


@pytest.mark.slow
@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario())
def test_sql_equals_the_oracle(chdb_client, fresh_db, sc):
    tenant, rows, w, th = sc
    if rows:
        seed(chdb_client, fresh_db, rows, ledger=False)
    refrows = reference_rows(rows)
    kw = {"start_ns": _ns(w.start), "end_ns": _ns(w.end), "as_of_ns": _ns(w.clock())}
    # the report, with the drawn thresholds: every run whole, however far it reaches
    df = sustained_rejections(chdb_client, database=fresh_db, window=w, tenant=tenant,
                              thresholds=th)  # fmt: skip
    got = [
        (int(r.start.timestamp()) // 3600, r.hours, r.ongoing, r.to_agent, r.capability,
         r.settled, r.rejected, r.handoffs, r.end is None)
        for r in df.itertuples()
    ]  # fmt: skip
    want = [
        (s.first, s.last - s.first + 1, s.ongoing, s.to_agent, s.capability, s.settled,
         s.rejected, len(s.handoffs), s.ongoing)
        for s in ref.sustained_runs(refrows, th=th, **kw)
    ]  # fmt: skip
    assert got == want
    # the anomaly pass, with the settings' thresholds
    ids = anomaly_handoff_ids(chdb_client, database=fresh_db, window=w, tenant=tenant,
                              kind="sustained_rejections")  # fmt: skip
    assert ids == [h for _t, h in ref.sustained_ids(refrows, th=sustained_thresholds(), **kw)]
    ids = anomaly_handoff_ids(chdb_client, database=fresh_db, window=w, tenant=tenant,
                              kind="consumer_stalled")  # fmt: skip
    assert ids == [h for _t, h in ref.consumer_stalled_ids(refrows, stall_s=300, **kw)]
