"""Property: for random handoff histories, the SQL funnel and per-handoff anomalies equal the
independent pure-Python implementation of the contract (analytics.reference).

Histories are random walks through the state table with lost spans (including the create),
duplicate deliveries, skewed clocks, rows flagged valid=false, illegal rows, extra legal
rows (forks, messages after terminal), random evidence and deadlines. Each example seeds
its own tenant in one database. Derandomized, so a failure replays.
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

import pytest
from analytics_seed import T, create, seed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import Window, anomaly_handoff_ids, funnel
from analytics import reference as ref
from collector.contract import EVENTS, STATES, TRANSITIONS
from collector.semconv import MODES

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW_END = T0 + timedelta(hours=1)
EVIDENCE = [
    {"handoff.evidence.count": 2, "handoff.evidence.valid": True},
    {"handoff.evidence.count": 0, "handoff.evidence.valid": True},
    {"handoff.evidence.count": 1, "handoff.evidence.valid": False},
    {},
]
PER_HANDOFF_KINDS = (
    "invalid_transition",
    "duplicate_delivery",
    "clock_skew",
    "committed_without_evidence",
    "unknown_unresolved",
    "accepted_never_started",
    "implied_accept",
)
_tenants = itertools.count()


@st.composite
def history(draw, hid: str, tenant: str, as_of: datetime) -> list[T]:
    # ages around the settle thresholds (deadline + 60 s grace) and outside the window
    age = draw(st.sampled_from([10, 59, 62, 100, 179, 182, 359, 362, 600, 7200]))
    start = as_of - timedelta(seconds=age)
    deadline = draw(st.sampled_from([None, 1_000, 120_000, 36_000_000]))  # ms
    mode = draw(st.sampled_from(MODES))
    steps: list[tuple[str, str, str]] = [("", "create", "created")]
    state = "created"
    for _ in range(draw(st.integers(0, 6))):
        options = sorted((str(e), str(t)) for (f, e), t in TRANSITIONS.items() if f == state)
        if not options:
            break
        ev, to = draw(st.sampled_from(options))
        steps.append((state, ev, to))
        state = to
    if draw(st.integers(0, 9)) == 0:  # an extra legal row: a fork or a message after terminal
        (f, e), t = draw(st.sampled_from(sorted(TRANSITIONS.items())))
        steps.append((str(f), str(e), str(t)))
    if draw(st.integers(0, 14)) == 0:  # an illegal row
        steps.append(
            (
                draw(st.sampled_from(STATES)),
                draw(st.sampled_from(EVENTS)),
                draw(st.sampled_from(STATES)),
            )
        )
    out: list[T] = []
    for i, (f, e, t) in enumerate(steps):
        if draw(st.integers(0, 9)) == 0:  # lost span (the create too)
            continue
        at = start + timedelta(seconds=i * draw(st.sampled_from([0, 1, 30])))
        if draw(st.integers(0, 9)) == 0:  # skewed clock
            at -= timedelta(seconds=draw(st.integers(1, 900)))
        attrs: dict = {}
        if e in ("prepare", "commit", "resolve_committed"):
            attrs.update(draw(st.sampled_from(EVIDENCE)))
        if draw(st.integers(0, 19)) == 0:
            attrs["handoff.valid"] = False
        if e == "create" and not f:
            tr = create(
                hid,
                at,
                task_id=f"task-{hid}",
                mode=mode,
                deadline_ms=deadline,
                tenant=tenant,
                **attrs,
            )
        else:
            tr = T(hid, e, f, t, at, task_id=f"task-{hid}", tenant=tenant, attrs=attrs)
        out.append(tr)
        if draw(st.integers(0, 9)) == 0:  # duplicate delivery
            out.append(T(tr.handoff_id, tr.event, tr.from_state, tr.to_state, tr.at, task_id=tr.task_id,
                         tenant=tenant, attrs=tr.attrs, copy=1))  # fmt: skip
    return out


def _ref_row(t: T) -> dict:
    a = t.attrs
    return {
        "tenant": t.tenant,
        "handoff_id": t.handoff_id,
        "event": t.event,
        "from_state": t.from_state,
        "to_state": t.to_state,
        "valid": a.get("handoff.valid", True),
        "time_ns": int(t.at.timestamp()) * 1_000_000_000 + t.at.microsecond * 1000,
        "evidence_count": a.get("handoff.evidence.count"),
        "evidence_valid": a.get("handoff.evidence.valid"),
        "deadline_ms": a.get("handoff.deadline_ms") if t.event == "create" else None,
        "mode": a.get("handoff.mode", "") if t.event == "create" else "",
        "span_id": "",
    }


@st.composite
def scenario(draw):
    tenant = f"p{next(_tenants)}"
    as_of = T0 + timedelta(minutes=draw(st.integers(5, 75)))
    n = draw(st.integers(1, 12))
    rows = [tr for i in range(n) for tr in draw(history(f"h{i}", tenant, as_of))]
    return tenant, rows, as_of


@pytest.mark.slow
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario())
def test_sql_funnel_and_anomalies_equal_reference(chdb_client, fresh_db, sc):
    tenant, rows, as_of = sc
    if rows:
        seed(chdb_client, fresh_db, rows, ledger=False)
    w = Window(start=T0, end=WINDOW_END, as_of=as_of)
    got = funnel(chdb_client, database=fresh_db, window=w, tenant=tenant).iloc[0].to_dict()
    as_of_ns = int(as_of.timestamp()) * 1_000_000_000
    refrows = [_ref_row(t) for t in rows]
    want = ref.funnel_counts(refrows, start_ns=int(T0.timestamp()) * 10**9, end_ns=int(WINDOW_END.timestamp()) * 10**9,
                             as_of_ns=as_of_ns)  # fmt: skip
    for k, v in want.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(got[k]), k
        else:
            assert got[k] == pytest.approx(v), k
    # per-handoff anomaly kinds of the cohort
    by_h: dict[str, list[dict]] = {}
    for r in refrows:
        by_h.setdefault(r["handoff_id"], []).append(r)
    for kind in PER_HANDOFF_KINDS:
        sql_ids = anomaly_handoff_ids(
            chdb_client, database=fresh_db, window=w, kind=kind, tenant=tenant
        )
        ref_ids = []
        for h, hr in sorted(by_h.items()):
            f = ref.facts(h, hr, as_of_ns=as_of_ns)
            in_cohort = (
                f.created_ns is not None
                and w.start.timestamp() * 1e9 <= f.created_ns < w.end.timestamp() * 1e9
            )
            if in_cohort and kind in ref.handoff_anomalies(hr, as_of_ns=as_of_ns):
                ref_ids.append(h)
        assert sql_ids == ref_ids, kind
