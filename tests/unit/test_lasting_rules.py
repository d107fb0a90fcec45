"""The pure rules behind failures that last or never emit a span: the sustained-rejection
thresholds and hour rule, the stall threshold, the A2A codes of a task's end, the producer's
enqueue record, and the simulator's stalled consumers and refused card skills."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics._sql.stall import stall_seconds
from analytics._sql.sustained import SustainedThresholds, sustained_thresholds
from analytics.oracle.sustained import sustained_runs
from collector import Enqueued, Envelope, HandoffTracer, InMemoryRecorder
from collector import semconv as sc
from collector.a2a import a2a_state_error_code
from handoffs.simulator import Emitter, FailureRates, ScenarioConfig, plan_task

S = 10**9
T0 = 1_764_000_000 * S


def test_the_hour_rule_is_exact_at_the_rate():
    th = SustainedThresholds(Fraction(1, 2), 5, 2)
    assert th.holds(6, 3) and not th.holds(6, 2)  # 50 % exactly holds
    assert not th.holds(4, 4)  # too few settled
    # the SQL says the same in integers: 3 * 2 >= 1 * 6
    assert th.condition("n", "r") == "(n >= 5 AND r * 2 >= 1 * n)"


def test_thresholds_come_from_the_settings(monkeypatch):
    assert sustained_thresholds() == SustainedThresholds(Fraction(1, 2), 5, 2)
    monkeypatch.setenv("HANDOFFS_SUSTAINED_REJECTION_RATE", "0.3")
    monkeypatch.setenv("HANDOFFS_SUSTAINED_HOURS", "4")
    assert sustained_thresholds() == SustainedThresholds(Fraction(3, 10), 5, 4)
    assert sustained_thresholds(rate=0.25, hours=1).rate == Fraction(1, 4)
    for name, bad in (
        ("HANDOFFS_SUSTAINED_REJECTION_RATE", "0"),
        ("HANDOFFS_SUSTAINED_REJECTION_RATE", "half"),
        ("HANDOFFS_SUSTAINED_MIN_SETTLED", "0"),
        ("HANDOFFS_SUSTAINED_HOURS", "two"),
    ):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            sustained_thresholds()
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="hours"):
        SustainedThresholds(Fraction(1, 2), 5, 0)
    with pytest.raises(ValueError, match="rate"):
        SustainedThresholds(0.5, 5, 2)  # type: ignore[arg-type]


def test_stall_threshold_is_a_setting(monkeypatch):
    assert stall_seconds() == 300 and stall_seconds(60) == 60
    monkeypatch.setenv("HANDOFFS_CONSUMER_STALL_S", "-1")
    with pytest.raises(ValueError, match="HANDOFFS_CONSUMER_STALL_S"):
        stall_seconds()


def _hour(h: str, hour: int, i: int, rejected: bool) -> list[dict]:
    t = (T0 // (3600 * S) + hour) * 3600 * S + i * 60 * S
    base = {"tenant": "acme", "handoff_id": h, "valid": True, "attributes": {}}
    rows = [{**base, "event": "create", "from_state": "", "to_state": "created", "time_ns": t,
             "to_agent": "coder", "capabilities": ["code.write"]}]  # fmt: skip
    to = "rejected" if rejected else "canceled"
    rows.append({**base, "event": "reject" if rejected else "cancel", "from_state": "created",
                 "to_state": to, "time_ns": t + S})  # fmt: skip
    return rows


def test_a_run_is_whole_and_ongoing_until_the_hour_after_it_ends():
    rows = [r for hour in (1, 2, 3) for i in range(6) for r in _hour(f"h{hour}{i}", hour, i, i < 4)]
    th = SustainedThresholds(Fraction(1, 2), 5, 2)
    first = T0 // (3600 * S)
    window = {"start_ns": (first + 2) * 3600 * S, "end_ns": (first + 3) * 3600 * S}
    (run,) = sustained_runs(rows, as_of_ns=(first + 10) * 3600 * S, th=th, **window)
    assert (run.first - first, run.last - first, run.ongoing) == (1, 3, False)
    assert (run.settled, run.rejected, len(run.handoffs)) == (18, 12, 4)  # the window's own
    (run,) = sustained_runs(rows, as_of_ns=(first + 4) * 3600 * S + 5, th=th, **window)
    assert run.ongoing  # hour 4 is not over: the run may go on


def test_a_task_the_agent_rejects_refuses_the_skill():
    assert a2a_state_error_code("rejected") == "unknown_capability"
    assert a2a_state_error_code("TASK_STATE_REJECTED", "busy") == "busy"
    assert a2a_state_error_code("failed") == "a2a_failed"
    assert a2a_state_error_code("canceled", 7) == "a2a_canceled"  # not a code: ignored
    assert a2a_state_error_code("input-required") == "a2a_input_required"
    with pytest.raises(ValueError, match="a2a_state"):
        a2a_state_error_code("gone")


def test_the_producer_records_where_it_enqueued():
    rec = InMemoryRecorder()
    try:
        env = Envelope(task_id="t", handoff_id="h", from_agent="planner", to_agent="billing",
                       mode="delegate", topology="shared_queue")  # fmt: skip
        HandoffTracer("planner", tracer_provider=rec.provider).create(
            env, enqueued=Enqueued("jobs", 42)
        )
        (create,) = rec.transitions()
        assert (create[sc.QUEUE_NAME], create[sc.QUEUE_OFFSET]) == ("jobs", 42)
    finally:
        rec.shutdown()
    for bad, field in ((("", 1), "queue"), (("jobs", -1), "offset")):
        with pytest.raises(ValueError, match=field):
            Enqueued(*bad)
    with pytest.raises(TypeError, match="Enqueued"):
        HandoffTracer("planner", tracer_provider=None).create(env, enqueued=("jobs", 1))  # type: ignore[arg-type]


def _plans(rates: FailureRates, n: int = 400):
    cfg = ScenarioConfig(seed=3, rates=rates)
    return [plan_task(cfg, i, T0 + i * 10 * S) for i in range(n)]


def test_a_stalled_consumer_never_takes_the_message_and_the_card_skill_is_refused():
    rates = FailureRates.parse("consumer_stalled=0.3,card_skill_refused=0.3")
    seen: Counter[str] = Counter()
    for p in _plans(rates):
        events: dict[str, list[tuple[str, Any]]] = {}
        for s in p.steps:
            events.setdefault(s.handoff_id, []).append((s.event, s.attrs.get("error_code")))
        for h in p.handoffs:
            ev = events[h.handoff_id]
            if "consumer_stalled" in h.faults:
                assert p.topology == "shared_queue"
                # (an expire redelivered is a duplicate, no take)
                assert [e for e, _ in ev if e != "redeliver"] == ["create", "expire"]
                seen["consumer_stalled"] += 1
            if "card_skill_refused" in h.faults:
                assert p.topology == "federated_a2a"
                assert ("reject", "unknown_capability") in ev  # (then maybe a late message)
                seen["card_skill_refused"] += 1
        for s in p.steps:  # every shared-queue create says where it enqueued
            if p.topology == "shared_queue" and s.event == "create":
                assert isinstance(s.attrs["enqueued"], Enqueued)
    assert seen["consumer_stalled"] > 20 and seen["card_skill_refused"] > 10


def test_the_simulated_card_lists_the_refused_skill_and_is_fresh():
    rates = FailureRates.parse("card_skill_refused=1", base=FailureRates.none())
    exporter = InMemorySpanExporter()
    em = Emitter(exporter_factory=lambda _t, _k: exporter)
    plans = [p for p in _plans(rates, 200) if p.topology == "federated_a2a"][:5]
    for p in plans:
        em.emit_task(p)
    em.close()
    spans: list[dict[str, Any]] = [dict(s.attributes or {}) for s in exporter.get_finished_spans()]
    creates = [a for a in spans if a[sc.EVENT] == "create"]
    assert creates
    for a in creates:
        assert set(a[sc.CAPABILITIES]) <= set(a[sc.AGENT_CARD_SKILLS])
