"""Property: for random handoff histories, the SQL funnel and per-handoff anomalies equal the
independent pure-Python implementation of the contract (analytics.reference).

Histories are random walks through the state table with lost spans (including the create),
duplicate deliveries (a new span), resent spans (the same span stored again unchanged),
span ids reused with other content (another time, transition or attribute map), skewed clocks,
rows flagged valid=false, illegal rows, extra legal rows (forks, messages after terminal),
random evidence and deadlines. Each example seeds its own tenant in one database.
Derandomized, so a failure replays.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from analytics_seed import T, create, seed, span_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import (
    Window,
    anomalies,
    anomaly_handoff_ids,
    evidence_package,
    funnel,
    verify_package,
)
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
        if draw(st.integers(0, 9)) == 0:  # the same span resent: one span
            out.append(tr)
        reuse = draw(st.integers(0, 19))
        if reuse < 3:  # its span id again: another time, another transition, another map
            span = span_rows([tr])[0][2]
            if reuse == 0:
                out.append(T(tr.handoff_id, tr.event, tr.from_state, tr.to_state, tr.at + timedelta(seconds=1),
                             task_id=tr.task_id, tenant=tenant, attrs=tr.attrs, span_id=span))  # fmt: skip
            elif reuse == 1:
                (f2, e2), t2 = draw(st.sampled_from(sorted(TRANSITIONS.items())))
                out.append(T(tr.handoff_id, str(e2), str(f2), str(t2), tr.at, task_id=tr.task_id,
                             tenant=tenant, span_id=span))  # fmt: skip
            else:
                other = {**tr.attrs, **draw(st.sampled_from(EVIDENCE)), "handoff.note": "again"}
                out.append(replace(tr, attrs=other, span_id=span))
    return out


def _ref_row(t: T) -> dict:
    a = t.attrs
    _ns, trace, span, _name, _service, attributes, _tenant = span_rows([t])[0]
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
        "trace_id": trace,
        "span_id": span,
        "attributes": attributes,
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


@st.composite
def resent_scenario(draw):
    tenant, rows, as_of = draw(scenario())
    picks = st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=6) if rows else st.just([])
    return tenant, rows, draw(picks), as_of


def _anomaly_table(client, db: str, w: Window, tenant: str) -> dict:
    df = anomalies(client, database=db, window=w, tenant=tenant, examples=100)
    return {r.kind: (r.count, list(r.examples)) for r in df.itertuples()}


@pytest.mark.slow
@settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(resent_scenario())
def test_resent_spans_change_no_number(chdb_client, fresh_db, sc):
    """The same history under two tenants, the second with some of its spans stored again
    unchanged by a later insert (a transport resend): the funnel and every anomaly kind,
    cross-handoff ones included, are the same for both; every package verifies."""
    tenant, rows, picks, as_of = sc
    twin = f"{tenant}r"
    # the twin's spans keep the ids the first tenant's got (a default id hashes the tenant)
    ids = [span_rows([t])[0][1:3] for t in rows]
    twins = [
        replace(t, tenant=twin, trace_id=tr, span_id=sp)
        for t, (tr, sp) in zip(rows, ids, strict=True)
    ]
    seed(chdb_client, fresh_db, rows)
    seed(chdb_client, fresh_db, twins)
    seed(chdb_client, fresh_db, [twins[i] for i in picks])
    resent = [rows[i] for i in picks]
    w = Window(start=T0, end=WINDOW_END, as_of=as_of)
    a = funnel(chdb_client, database=fresh_db, window=w, tenant=tenant).iloc[0].to_dict()
    b = funnel(chdb_client, database=fresh_db, window=w, tenant=twin).iloc[0].to_dict()
    for k, v in a.items():
        assert (math.isnan(v) and math.isnan(b[k])) or v == b[k], k
    assert _anomaly_table(chdb_client, fresh_db, w, tenant) == _anomaly_table(
        chdb_client, fresh_db, w, twin
    )
    for hid in sorted({t.handoff_id for t in resent}):
        pa = evidence_package(
            chdb_client, database=fresh_db, handoff_id=hid, tenant=tenant, as_of=as_of
        )
        pb = evidence_package(
            chdb_client, database=fresh_db, handoff_id=hid, tenant=twin, as_of=as_of
        )
        assert pa is not None and pb is not None
        same = ("event", "from_state", "to_state", "time_ns")
        assert [[t[c] for c in same] for t in pa["transitions"]] == [
            [t[c] for c in same] for t in pb["transitions"]
        ]
        assert pa["anomalies"] == pb["anomalies"], hid
        assert sum(t["arrivals"] for t in pb["transitions"]) == pb["integrity"]["ledger"]["rows"]
        assert verify_package(chdb_client, pb, database=fresh_db).ok, hid
