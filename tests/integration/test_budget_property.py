"""Property: for random handoff histories, the SQL of deadline_overrun, tool_budget_exceeded
and ack_missing (analytics/_sql/budget.py) flags exactly the handoffs the pure-Python
reference (analytics.oracle.budget) flags.

Histories are random walks through the state table whose transitions land around the
boundaries the kinds judge (a deadline of 1 s or 60 s, a ttl of 1 s or 30 s: one
millisecond before, at, after), in any clock order (the machine, not the clock, decides
which terminal state came first); with forks and messages after a terminal state, illegal
rows, rows flagged valid=false, lost spans (the create too), duplicate deliveries and spans
stored twice; envelopes with and without deadline_ms, max_tool_calls, requires_ack and
ttl_s; result rows with tool calls around the budget (illegal ones too); handoffs created
before the window. Rows go in two inserts (so state rows merge at read time), with the
settle job run between them or not (so the cohort comes from the settled copy or the
summary). Each example seeds its own tenant. Derandomized, so a failure replays.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import Window, anomalies, settle
from analytics.oracle.budget import BUDGET_KINDS, budget_anomalies
from collector import semconv as sc
from collector.contract import EVENTS, STATES, TRANSITIONS, Event, State
from tests.analytics_seed import T, create, seed, span_rows

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW_END = T0 + timedelta(hours=1)
AS_OF = T0 + timedelta(minutes=30)
_tenants = itertools.count()
#: event paths from created a history starts with (then a random walk goes on)
PATHS = (
    (),
    ("reject",),
    ("expire",),
    ("accept", "start", "commit"),
    ("accept", "start", "prepare", "commit", "verify"),
    ("accept", "start", "fail"),
    ("accept", "start", "timeout", "resolve_committed"),
    ("accept", "start", "commit", "verify_fail", "resolve_failed"),
)
#: offsets (ms) of a transition after its create: around 1 s and 60 s, and far after
OFFSETS_MS = (0, 500, 999, 1000, 1001, 29_999, 30_000, 30_001, 59_999, 60_000, 60_001, 600_000)


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


@st.composite
def history(draw, hid: str, tenant: str) -> list[T]:
    # ages at as_of around the ttl boundaries; 3600 s: created before the window
    age_ms = draw(st.sampled_from([500, 999, 1000, 1001, 30_000, 30_001, 600_000, 3_600_000]))
    created = AS_OF - timedelta(milliseconds=age_ms)
    env: dict = {}
    deadline = draw(st.sampled_from([None, 1000, 1000, 60_000]))
    budget = draw(st.sampled_from([None, 0, 3]))
    if budget is not None:
        env[sc.MAX_TOOL_CALLS] = budget
    ack = draw(st.sampled_from([None, True, True, False]))
    if ack is not None:
        env[sc.MESSAGE_REQUIRES_ACK] = ack
    ttl = draw(st.sampled_from([None, 1, 1, 30]))
    if ttl is not None:
        env[sc.MESSAGE_TTL_S] = ttl
    steps: list[tuple[str, str, str]] = [("", "create", "created")]
    state = "created"
    for ev in draw(st.sampled_from(PATHS)):  # a common way to an outcome, or none
        to = TRANSITIONS[(State(state), Event(ev))]
        steps.append((state, ev, str(to)))
        state = str(to)
    for _ in range(draw(st.integers(0, 3))):
        options = sorted((str(e), str(t)) for (f, e), t in TRANSITIONS.items() if f == state)
        if not options:
            break
        ev, to = draw(st.sampled_from(options))
        steps.append((state, ev, to))
        state = to
    if draw(st.integers(0, 5)) == 0:  # an extra legal row: a fork or a message after terminal
        (f, e), t = draw(st.sampled_from(sorted(TRANSITIONS.items())))
        steps.append((str(f), str(e), str(t)))
    if draw(st.integers(0, 9)) == 0:  # an illegal row
        steps.append((draw(st.sampled_from(STATES)), draw(st.sampled_from(EVENTS)),
                      draw(st.sampled_from(STATES))))  # fmt: skip
    out: list[T] = []
    for f, e, t in steps:
        if draw(st.integers(0, 11)) == 0:  # lost span (the create too)
            continue
        at = created + timedelta(
            milliseconds=0 if e == "create" else draw(st.sampled_from(OFFSETS_MS))
        )
        attrs: dict = {}
        if e in ("prepare", "commit", "resolve_committed") or draw(st.integers(0, 9)) == 0:
            # tool calls around the budget, on results (and now and then on another row)
            n = draw(st.sampled_from([None, 0, 2, 3, 4]))
            if n is not None:
                attrs[sc.TOOL_CALLS] = n
        if draw(st.integers(0, 14)) == 0:
            attrs[sc.VALID] = False
        if e == "create" and not f:
            tr = create(hid, at, task_id=f"task-{hid}", deadline_ms=deadline, tenant=tenant,
                        **env, **attrs)  # fmt: skip
        else:
            tr = T(hid, e, f, t, at, task_id=f"task-{hid}", actor="worker", tenant=tenant,
                   attrs=attrs)  # fmt: skip
        out.append(tr)
        if draw(st.integers(0, 9)) == 0:  # duplicate delivery (a new span)
            out.append(T(tr.handoff_id, tr.event, tr.from_state, tr.to_state,
                         tr.at + timedelta(milliseconds=draw(st.sampled_from([0, 2000]))),
                         task_id=tr.task_id, actor=tr.actor, tenant=tenant, attrs=tr.attrs,
                         copy=1))  # fmt: skip
        if draw(st.integers(0, 9)) == 0:  # the same span stored again
            out.append(tr)
    return out


@st.composite
def scenario(draw):
    tenant = f"b{next(_tenants)}"
    settled_between = draw(st.booleans())
    rows = [r for k in range(draw(st.integers(1, 8))) for r in draw(history(f"h{k}", tenant))]
    blocks = [draw(st.integers(0, 1)) for _ in rows]
    return tenant, rows, blocks, settled_between


def _ref_row(t: T) -> dict:
    _time, trace, span, _name, _service, attributes, _tenant = span_rows([t])[0]
    return {
        "tenant": t.tenant,
        "handoff_id": t.handoff_id,
        "event": t.event,
        "from_state": t.from_state,
        "to_state": t.to_state,
        "valid": t.attrs.get(sc.VALID, True),
        "time_ns": _ns(t.at),
        "deadline_ms": t.attrs.get(sc.DEADLINE_MS) if t.event == "create" else None,
        "trace_id": trace,
        "span_id": span,
        "attributes": attributes,
    }


@pytest.mark.slow
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario())
def test_budget_kinds_equal_reference(chdb_client, fresh_db, sc_):
    tenant, rows, blocks, settled_between = sc_
    for i in (0, 1):
        block = [r for r, b in zip(rows, blocks, strict=True) if b == i]
        if block:
            seed(chdb_client, fresh_db, block, ledger=False)
        if i == 0 and settled_between:
            settle(chdb_client, database=fresh_db, lag_s=0)
    want = budget_anomalies([_ref_row(t) for t in rows], start_ns=_ns(T0),
                            end_ns=_ns(WINDOW_END), as_of_ns=_ns(AS_OF))  # fmt: skip
    w = Window(start=T0, end=WINDOW_END, as_of=AS_OF)
    df = anomalies(chdb_client, database=fresh_db, window=w, tenant=tenant, examples=1000,
                   kinds=BUDGET_KINDS)  # fmt: skip
    for r in df.itertuples():
        ids = sorted(h for (_t, h), kinds in want.items() if r.kind in kinds)
        assert (r.count, list(r.examples)) == (len(ids), ids), r.kind
