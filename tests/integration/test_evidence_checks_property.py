"""Property: for random handoffs declaring (or not) an evidence policy and a reply contract,
the SQL evidence kinds and the funnel's checked P_evidence equal the pure-Python reference
(analytics.oracle.evidence, analytics.oracle.funnel).

Each handoff draws a policy (a window of valid_after and/or valid_before, min_refs,
require_claims, must_return; each often absent, sometimes a second create disagreeing),
a path through the results (commit; prepare then commit, fail or nothing; a timeout then
resolve_committed), and on each result refs (repeated and empty ids among them), claims
(absent, short, empty items), valid_at times a microsecond around the window's edges (or
empty, or not a time), result fields, and the emitter's evidence flags; rows are re-emitted
(a new span) or resent (the same span stored again), some flagged valid=false, and go in
one to three inserts with the flags settled between some of them. Each example seeds its own
tenant in one database. Derandomized, so a failure replays.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import Window, anomalies, funnel, settle
from analytics.oracle import evidence as ref_ev
from analytics.oracle import funnel as ref
from tests.analytics_seed import T, create, seed, span_rows

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW_END = T0 + timedelta(hours=1)
#: the policy window's edges
AFTER = T0 - timedelta(hours=1)
BEFORE = T0 + timedelta(hours=2)
US = timedelta(microseconds=1)
KINDS = (*ref_ev.EVIDENCE_KINDS, "committed_without_evidence")
_tenants = itertools.count()


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond:06d}Z" if t.microsecond else "Z")


#: valid_at values inside the window (on valid_after, a microsecond inside either edge) and
#: not (a microsecond before valid_after, on valid_before, empty, not a time)
INSIDE = [_iso(AFTER), _iso(BEFORE - US), _iso(AFTER + US), _iso(T0)]
OUTSIDE = [_iso(AFTER - US), _iso(BEFORE), "", "soon"]
FIELDS = ["answer", "sources", "cost"]
_often = st.sampled_from([True, True, False])
_mostly = st.sampled_from([True, True, True, False])


@st.composite
def policy(draw) -> dict:
    """A create's check attributes, each often absent (all absent: no policy)."""
    a: dict = {}
    if draw(_often):
        a["handoff.evidence_policy.valid_after"] = _iso(AFTER)
    if draw(st.booleans()):
        a["handoff.evidence_policy.valid_before"] = _iso(BEFORE)
    if draw(st.booleans()):
        a["handoff.evidence_policy.min_refs"] = draw(st.sampled_from([0, 1, 2, 3]))
    if draw(st.booleans()):
        a["handoff.evidence_policy.require_claims"] = draw(st.booleans())
    if draw(st.booleans()):
        a["handoff.reply_contract.must_return"] = draw(
            st.sampled_from([["answer"], ["answer", "sources"], []])
        )
    return a


@st.composite
def result_attrs(draw) -> dict:
    """A result's evidence as the emitter sends it: refs, claims and valid_at aligned by
    index (or short), fields returned, count and valid flags."""
    refs = draw(st.lists(st.sampled_from(["r1", "r2", "r3", ""]), max_size=3))
    a: dict = {"handoff.evidence_refs": refs}
    if draw(_often):
        n = len(refs) - draw(st.sampled_from([0, 0, 0, 1]))
        a["handoff.evidence.claims"] = ["seen" if draw(_mostly) else "" for _ in range(max(n, 0))]
    if draw(_often):
        n = len(refs) - draw(st.sampled_from([0, 0, 0, 1]))
        a["handoff.evidence.valid_at"] = [
            draw(st.sampled_from(INSIDE if draw(_mostly) else OUTSIDE)) for _ in range(max(n, 0))
        ]
    if draw(_often):
        a["handoff.result.fields"] = draw(st.lists(st.sampled_from(FIELDS), max_size=3))
    a.update(draw(st.sampled_from([
        {"handoff.evidence.count": len(refs), "handoff.evidence.valid": True},
        {"handoff.evidence.count": 2, "handoff.evidence.valid": True},
        {"handoff.evidence.count": 1, "handoff.evidence.valid": False},
        {},
    ])))  # fmt: skip
    return a


PATHS = [
    [("running", "commit", "committed")],
    [("running", "prepare", "prepared"), ("prepared", "commit", "committed")],
    [("running", "prepare", "prepared"), ("prepared", "fail", "failed")],
    [("running", "prepare", "prepared")],
    [("running", "timeout", "unknown"), ("unknown", "resolve_committed", "committed")],
    [("running", "commit", "committed"), ("committed", "verify", "verified")],
]


@st.composite
def handoff(draw, hid: str, tenant: str, as_of: datetime) -> list[T]:
    t0 = as_of - timedelta(seconds=draw(st.sampled_from([30, 600, 600, 4000])))
    out = [create(hid, t0, task_id=f"task-{hid}", tenant=tenant, **draw(policy()))]
    if draw(st.integers(0, 5)) == 0:  # a second create disagreeing (a new span, later)
        out.append(replace(create(hid, t0 + timedelta(seconds=1), task_id=f"task-{hid}",
                                  tenant=tenant, **draw(policy())), copy=1))  # fmt: skip
    steps = [("created", "accept", "accepted"), ("accepted", "start", "running")]
    steps += draw(st.sampled_from(PATHS))
    for i, (f, e, t) in enumerate(steps, start=1):
        attrs = draw(result_attrs()) if e in ("prepare", "commit", "resolve_committed") else {}
        if draw(st.integers(0, 14)) == 0:
            attrs["handoff.valid"] = False
        tr = T(hid, e, f, t, t0 + timedelta(seconds=2 * i), tenant=tenant, attrs=attrs)
        out.append(tr)
        if attrs and draw(st.integers(0, 3)) == 0:  # re-emitted: a new span, other evidence
            out.append(replace(tr, attrs=draw(result_attrs()), copy=1))
        if draw(st.integers(0, 5)) == 0:  # the same span resent: one span
            out.append(tr)
    return out


@st.composite
def scenario(draw):
    tenant = f"ev{next(_tenants)}"
    as_of = T0 + timedelta(minutes=draw(st.integers(5, 90)))
    rows = [
        r for i in range(draw(st.integers(1, 10))) for r in draw(handoff(f"h{i}", tenant, as_of))
    ]
    rows = [replace(t, task_id=span_rows([t])[0][5]["handoff.task_id"]) for t in rows]
    n = draw(st.integers(1, 3))
    blocks = draw(st.lists(st.integers(0, n - 1), min_size=len(rows), max_size=len(rows)))
    settles = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    inserts = [[r for r, b in zip(rows, blocks, strict=True) if b == i] for i in range(n)]
    return tenant, inserts, as_of, settles


def _ref_row(t: T) -> dict:
    _ns, trace, span, _name, _service, attributes, _tenant = span_rows([t])[0]
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
        "deadline_ms": None,
        "mode": a.get("handoff.mode", "") if t.event == "create" else "",
        "trace_id": trace,
        "span_id": span,
        "attributes": attributes,
    }


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


@pytest.mark.slow
@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario())
def test_evidence_kinds_and_checked_funnel_equal_reference(chdb_client, fresh_db, sc):
    tenant, inserts, as_of, settles = sc
    for block, settled in zip(inserts, settles, strict=True):
        if block:
            seed(chdb_client, fresh_db, block, ledger=False)
        if settled:
            settle(chdb_client, database=fresh_db, lag_s=0)
    refrows = [_ref_row(t) for block in inserts for t in block]
    w = Window(start=T0, end=WINDOW_END, as_of=as_of)
    got = funnel(chdb_client, database=fresh_db, window=w, tenant=tenant).iloc[0].to_dict()
    want = ref.funnel_counts(refrows, start_ns=_ns(T0), end_ns=_ns(WINDOW_END), as_of_ns=_ns(as_of))
    assert set(want) <= set(got)
    for k, v in want.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(got[k]), k
        else:
            assert got[k] == pytest.approx(v), k
    assert got["committed"] <= got["evidenced"] <= got["evidence_claimed"] <= got["executed"]
    # the kinds, and committed_without_evidence following the checked V(h)
    flagged = ref_ev.evidence_anomalies(refrows, start_ns=_ns(T0), end_ns=_ns(WINDOW_END))
    by_h: dict[str, list[dict]] = {}
    for r in refrows:
        by_h.setdefault(r["handoff_id"], []).append(r)
    for h, hr in by_h.items():
        f = ref.facts(h, hr, as_of_ns=_ns(as_of))
        in_cohort = f.created_ns is not None and _ns(T0) <= f.created_ns < _ns(WINDOW_END)
        if in_cohort and "committed_without_evidence" in ref.handoff_anomalies(
            hr, as_of_ns=_ns(as_of)
        ):
            flagged.setdefault((tenant, h), []).append("committed_without_evidence")
    df = anomalies(
        chdb_client, database=fresh_db, window=w, tenant=tenant, examples=1000, kinds=KINDS
    )
    for r in df.itertuples():
        ids = sorted(h for (_t, h), kinds in flagged.items() if r.kind in kinds)
        assert (r.count, sorted(r.examples)) == (len(ids), ids), r.kind
