"""deadline_overrun, tool_budget_exceeded, ack_missing and the strict receiver's refusals on
a hand-computed fixture: the shim (HandoffTracer) through the real OTel SDK and OTLP/HTTP
exporter into a real `handoffs serve`, read with analytics.anomalies; each kind with its
positives and near misses, exact ids.

Every handoff is created at t0 (a whole hour 8 h ago); times below are seconds after t0.
Window [t0, t0+1h), as_of t0+2h. The planner sends, the coder receives (strict tracers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import analytics
from analytics._sql import contract as cs
from collector import Envelope, HandoffTracer, IllegalTransition
from collector.tracer import Handoff

S = 10**9
HOUR = 3_600 * S
T0 = (time.time_ns() // HOUR - 8) * HOUR
KINDS = (
    "deadline_overrun",
    "tool_budget_exceeded",
    "ack_missing",
    "invalid_transition",
    "wrong_consumer",
)
EXPECTED = {
    "deadline_overrun": ["d1", "d3", "d4", "d7"],
    "tool_budget_exceeded": ["b1", "b4"],
    "ack_missing": ["a1", "a4"],
    "invalid_transition": ["r1"],
    "wrong_consumer": [],
}


def at(seconds: float) -> int:
    return T0 + round(seconds * 1000) * 1_000_000


def env(hid: str, **kw: object) -> Envelope:
    base: dict = {"task_id": f"task-{hid}", "handoff_id": hid, "from_agent": "planner",
                  "to_agent": "coder", "mode": "delegate"}  # fmt: skip
    return Envelope(**{**base, **kw})


def emit(planner: HandoffTracer, coder: HandoffTracer) -> None:
    def send(hid: str, **kw: object) -> tuple[Handoff, Handoff]:
        h = planner.create(env(hid, **kw), at=at(0))
        return h, coder.receive(h.to_wire())

    def run(w: Handoff) -> None:
        w.accept(at=at(1))
        w.start(at=at(2))

    # -- deadline_overrun (deadline 60 s): d1 committed at 60.001, d3 rejected at 61, d4
    # failed at 61, d7 timed out at 60 then resolved committed at 120. Not: d2 (committed at
    # exactly 60), d5 (no deadline: committed at 400), d6 (the sender expired it at 61), d8
    # (committed at 30, verified at 90)
    dl = {"deadline_ms": 60_000}
    for hid, t in (("d1", 60.001), ("d2", 60)):
        _, w = send(hid, **dl)
        run(w)
        w.commit(at=at(t), evidence_count=1, evidence_valid=True)
    _, w = send("d3", **dl)
    w.reject(at=at(61), error_code="busy")
    _, w = send("d4", **dl)
    run(w)
    w.fail(at=at(61), error_code="tool_error")
    _, w = send("d5")
    run(w)
    w.commit(at=at(400))
    h, _ = send("d6", **dl)
    h.expire(at=at(61), error_code="deadline")
    h, w = send("d7", **dl)
    run(w)
    h = planner.receive(w.to_wire())
    h.timeout(at=at(60), error_code="deadline")
    h.resolve_committed(at=at(120))
    h, w = send("d8", **dl)
    run(w)
    w.commit(at=at(30))
    planner.receive(w.to_wire()).verify(at=at(90), read_back=True)
    # -- tool_budget_exceeded (budget 3): b1 counted 4 calls, b4 prepared with 4 then
    # failed. Not: b2 (3 calls, at the budget), b3 (no budget, 50 calls)
    for hid, calls in (("b1", 4), ("b2", 3)):
        _, w = send(hid, max_tool_calls=3)
        run(w)
        for _ in range(calls):
            w.count_tool_call()
        w.commit(at=at(5))
    _, w = send("b3")
    run(w)
    w.commit(at=at(5), tool_calls=50)
    _, w = send("b4", max_tool_calls=3)
    run(w)
    w.prepare(at=at(4), tool_calls=4)
    w.fail(at=at(5), error_code="tool_error")
    # -- ack_missing (requires_ack, ttl 30 s): a1 accepted at 31, a4 never acknowledged.
    # Not: a2 (accepted at exactly 30), a3 (rejected at 10), a5 (no ack required, accepted
    # at 100), a6 (ttl 3 h, not acknowledged yet at as_of t0+2h)
    ack = {"requires_ack": True, "ttl_s": 30, "message_id": "msg", "payload_ref": "s3://p/1"}
    for hid, t in (("a1", 31), ("a2", 30)):
        _, w = send(hid, **ack)
        w.accept(at=at(t))
    _, w = send("a3", **ack)
    w.reject(at=at(10), error_code="busy")
    send("a4", **ack)
    _, w = send("a5", requires_ack=False, ttl_s=30)
    w.accept(at=at(100))
    send("a6", requires_ack=True, ttl_s=3 * 3600)
    # -- refusals: r1 (committed, then a late accept the strict coder refuses: its reject,
    # flagged). Not: r2 (the planner's own illegal commit raises and records nothing)
    _, w = send("r1")
    run(w)
    w.commit(at=at(3))
    late = coder.receive(w.to_wire())
    with pytest.raises(IllegalTransition):
        late.accept(at=at(10))
    h, w = send("r2")
    with pytest.raises(IllegalTransition):
        h.commit(at=at(5))
    w.accept(at=at(1))


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("budget-wire"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stored(serve) -> Callable[..., list[tuple]]:
    provider = TracerProvider(resource=Resource.create({"service.name": "budget-wire"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"))
    )
    emit(HandoffTracer("planner", tracer_provider=provider),
         HandoffTracer("coder", tracer_provider=provider))  # fmt: skip
    provider.force_flush()
    provider.shutdown()
    serve.wait_stored()

    def query(sql: str) -> list[tuple]:
        with serve.client() as c:
            return c.query(sql.format(db=serve.database)).result_rows

    return query


def _window() -> analytics.Window:
    start = datetime.fromtimestamp(T0 / S, UTC)
    return analytics.Window(start=start, end=datetime.fromtimestamp((T0 + HOUR) / S, UTC),
                            as_of=datetime.fromtimestamp((T0 + 2 * HOUR) / S, UTC))  # fmt: skip


def test_each_kind_flags_exactly_its_positives(serve, stored):
    with serve.client() as c:
        df = analytics.anomalies(c, database=serve.database, window=_window(), kinds=KINDS,
                                 examples=50)  # fmt: skip
    got = {r.kind: (r.count, sorted(r.examples)) for r in df.itertuples()}
    assert got == {k: (len(v), v) for k, v in EXPECTED.items()}


def test_the_message_fields_and_tool_calls_are_on_the_wire(stored):
    (row,) = stored(
        "SELECT attributes['handoff.message.id'], attributes['handoff.message.ttl_s'],"
        " attributes['handoff.message.requires_ack'], attributes['handoff.message.payload_ref'],"
        " audit_attrs FROM {db}.handoff_transitions WHERE handoff_id = 'a1' AND event = 'create'"
    )
    assert row == ("msg", "30", "true", "s3://p/1", True)
    rows = stored(
        "SELECT handoff_id, event, attributes['handoff.tool_calls'] FROM {db}.handoff_transitions"
        " WHERE mapContains(attributes, 'handoff.tool_calls') ORDER BY handoff_id, event"
    )
    assert rows == [("b1", "commit", "4"), ("b2", "commit", "3"), ("b3", "commit", "50"),
                    ("b4", "prepare", "4")]  # fmt: skip


def test_the_refused_message_is_stored_as_a_flagged_reject(stored):
    rows = stored(
        "SELECT handoff_id, actor, from_state, to_state, valid, error_code,"
        " attributes['handoff.invalid_reason'] FROM {db}.handoff_transitions"
        " WHERE event = 'reject' AND handoff_id LIKE 'r%'"
    )
    assert rows == [
        ("r1", "coder", "committed", "rejected", False, "conflict",
         "refused 'accept': event 'accept' is not allowed from state 'committed'; "
         "allowed: verify, verify_fail"),
    ]  # fmt: skip
    # r2: the sender's refused commit left nothing; the receiver's accept is stored as usual
    assert stored(
        "SELECT event FROM {db}.handoff_transitions WHERE handoff_id = 'r2' ORDER BY time"
    ) == [("create",), ("accept",)]
    # the refusal never ended r1: its counted transitions reach committed, none rejected
    assert stored(
        "SELECT bitAnd(tmask, "
        + str(cs.REJECTED_MASK)
        + ") = 0, bitAnd(tmask, "
        + str(cs.COMMITTED_MASK)
        + ") != 0 FROM {db}.handoff_summary FINAL WHERE handoff_id = 'r1'"
    ) == [(True, True)]
