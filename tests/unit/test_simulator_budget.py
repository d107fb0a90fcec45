"""The simulator's deadlines, tool budgets and acknowledgements (handoffs/simulator/_budget.py):
every planned envelope is valid, the faults are injected at their rates, and each handoff's
labels are exactly what analytics.oracle.budget finds in its planned steps (the labels
are recomputed from the plan, so ordinary traffic that breaks a promise is labelled too)."""

from __future__ import annotations

from collections import Counter

import pytest

from analytics.oracle.budget import BUDGET_KINDS, budget_kinds
from collector import Envelope
from collector import semconv as sc
from collector.contract import next_state
from handoffs.simulator import FAULTS, FailureRates, ScenarioConfig, SimulatorConfigError, plan_task
from handoffs.simulator._model import BUDGET_FAULTS, CLI_BUDGET_RATE

T0 = 1_800_000_000 * 10**9
RATE = 0.1
_ENVELOPE_ATTRS = {
    "max_tool_calls": sc.MAX_TOOL_CALLS,
    "requires_ack": sc.MESSAGE_REQUIRES_ACK,
    "ttl_s": sc.MESSAGE_TTL_S,
}


def _text(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _rows(plan) -> dict[str, list[dict]]:
    """Each handoff's planned steps as the rows the store would hold (illegal steps flagged,
    a redelivery a copy of the previous row)."""
    envelopes = {h.handoff_id: h.envelope for h in plan.handoffs}
    state: dict[str, str | None] = {}
    rows: dict[str, list[dict]] = {}
    for s in plan.steps:
        hr = rows.setdefault(s.handoff_id, [])
        if s.event == "redeliver":
            hr.append({**hr[-1], "time_ns": s.at_ns})
            continue
        frm = state.get(s.handoff_id)
        to = str(next_state(frm, s.event)) if not s.illegal else "running"
        attrs = {sc.TOOL_CALLS: str(s.attrs["tool_calls"])} if "tool_calls" in s.attrs else {}
        env = envelopes[s.handoff_id]
        if s.event == "create":
            attrs |= {
                a: _text(env[k]) for k, a in _ENVELOPE_ATTRS.items() if env.get(k) is not None
            }
        hr.append({"handoff_id": s.handoff_id, "event": s.event, "from_state": frm or "",
                   "to_state": to, "valid": not s.illegal, "time_ns": s.at_ns,
                   "deadline_ms": env.get("deadline_ms") if s.event == "create" else None,
                   "attributes": attrs})  # fmt: skip
        if not s.illegal:
            state[s.handoff_id] = to
    return rows


@pytest.fixture(scope="module")
def plans():
    rates = FailureRates.parse(",".join(f"{k}={RATE}" for k in BUDGET_FAULTS))
    cfg = ScenarioConfig(seed=11, rates=rates)
    return [plan_task(cfg, i, T0 + i * 60 * 10**9) for i in range(300)]


def test_labels_are_what_the_reference_finds_in_each_plan(plans):
    seen: Counter[str] = Counter()
    for plan in plans:
        rows = _rows(plan)
        for h in plan.handoffs:
            Envelope(**h.envelope)  # every planned envelope is valid
            want = budget_kinds(rows[h.handoff_id], as_of_ns=2**62)
            assert h.faults & set(BUDGET_KINDS) == want, (h.handoff_id, h.faults)
            seen.update(want)
    assert all(seen[k] > 20 for k in BUDGET_KINDS), seen


def test_the_faults_are_injected_at_their_rates(plans):
    intents = sum(p.intents for p in plans)
    drawn: Counter[str] = Counter()
    for plan in plans:
        for h in plan.handoffs:
            for s in plan.steps:
                if s.handoff_id == h.handoff_id and s.attrs.get("tool_calls") is not None:
                    budget = h.envelope["max_tool_calls"]
                    drawn["over"] += s.attrs["tool_calls"] > budget
                    drawn["at"] += s.attrs["tool_calls"] == budget  # near misses occur
                    break
            drawn["short_ttl"] += h.envelope.get("ttl_s") == 10
    sd = (RATE * (1 - RATE) / intents) ** 0.5
    # over budget: the drawn rate per intent (a failed attempt may be retried: a few more)
    assert abs(drawn["over"] / intents - RATE) < 5 * sd, (drawn, intents)
    assert abs(drawn["short_ttl"] / intents - RATE) < 5 * sd, (drawn, intents)
    assert drawn["at"] > 0


def test_message_topologies_ask_for_an_ack_and_carry_their_fields(plans):
    by_topology: dict[str, Counter] = {}
    for plan in plans:
        c = by_topology.setdefault(plan.topology, Counter())
        for h in plan.handoffs:
            e = h.envelope
            c["handoffs"] += 1
            # its own id, or the message it retries, replays or resends
            c["message_id"] += str(e.get("message_id", "")).startswith("msg-")
            c["ack"] += bool(e.get("requires_ack"))
            c["payload_ref"] += "payload_ref" in e
    for topology, c in by_topology.items():
        assert c["message_id"] == c["handoffs"], topology
        if topology in ("shared_queue", "federated_a2a"):
            assert c["ack"] == c["handoffs"], topology
        else:  # only the ack_missing attempts ask
            assert 0 < c["ack"] < c["handoffs"] / 2, topology
    assert by_topology["shared_queue"]["payload_ref"] == by_topology["shared_queue"]["handoffs"]


def test_the_rates_are_fields_of_their_own():
    assert set(BUDGET_FAULTS) <= set(FAULTS)
    assert all(getattr(FailureRates(), k) == 0.0 for k in BUDGET_FAULTS)  # off unless asked
    assert all(getattr(FailureRates.cli_defaults(), k) == CLI_BUDGET_RATE for k in BUDGET_FAULTS)
    with pytest.raises(SimulatorConfigError, match="ack_missing: must be in"):
        FailureRates(ack_missing=1.5)
    with pytest.raises(SimulatorConfigError, match="deadline_overrun: rate must be a number"):
        FailureRates.parse("deadline_overrun=often")
