"""The simulator's injections of what senders do without declaring it, on plans (pure): each
kind is a rate with a CLI flag, refused when the rates sum over 1, and shapes only what its
anomaly kind reads."""

from __future__ import annotations

import random

import pytest

from handoffs.cli import build_parser
from handoffs.simulator import (
    CLI_AUDIT_RATE,
    INFERRED_FAULTS,
    FailureRates,
    ScenarioConfig,
    SimulatorConfigError,
    plan_task,
)
from handoffs.simulator._builder import Builder
from handoffs.simulator._catalog import WORKFLOWS
from handoffs.simulator._inferred import plan_inferred

T0 = 1_764_000_000 * 10**9
S = 10**9


def _labelled(kind: str, label: str | None = None, n: int = 150):
    cfg = ScenarioConfig(rates=FailureRates.parse(f"{kind}=0.4", base=FailureRates.none()))
    out = []
    for i in range(n):
        plan = plan_task(cfg, i, T0 + i * 60 * S)
        by_id = {h.handoff_id: h for h in plan.handoffs}
        out += [(plan, h, by_id) for h in plan.handoffs if (label or kind) in h.faults]
    assert out, kind
    return out


def _steps(plan, hid: str):
    return [s for s in plan.steps if s.handoff_id == hid]


def test_each_kind_is_a_rate_with_a_cli_flag_and_on_in_the_cli_defaults():
    base = FailureRates.cli_defaults()
    args = build_parser().parse_args(["simulate", "--blind-resend-rate", "0.02"])
    assert args.rate_blind_resend == 0.02
    for kind in INFERRED_FAULTS:
        assert getattr(FailureRates(), kind) == 0.0
        assert getattr(base, kind) == CLI_AUDIT_RATE
    with pytest.raises(SimulatorConfigError, match=r"sum to 1\.200 > 1"):
        FailureRates.parse("blind_resend=0.6,missing_grant=0.6")


def test_unknown_kind_is_refused():
    cfg = ScenarioConfig()
    b = Builder(cfg, random.Random(1), "t1", "acme", "in_process")
    with pytest.raises(ValueError, match="unknown inferred kind 'nope'"):
        plan_inferred(b, WORKFLOWS[0][2][0], T0, "nope", causation=None, verify_p=0.0)


def test_blind_resend_is_a_new_id_and_key_while_the_first_is_unknown():
    for plan, h, _by_id in _labelled("blind_resend", "blind_retry"):
        e = h.envelope
        assert "retry_of" not in e and e["attempt"] == 1
        (first,) = [
            x for x in plan.handoffs if x is not h and x.envelope["objective"] == e["objective"]
        ]
        assert first.envelope["idempotency_key"] != e["idempotency_key"]
        events = [(s.event, s.at_ns) for s in _steps(plan, first.handoff_id)]
        t_in = next(t for ev, t in events if ev == "timeout")
        t_out = next(t for ev, t in events if ev == "resolve_failed")
        assert t_in < h.created_ns < t_out


def test_final_refusal_is_retried_and_refused_again():
    for plan, h, _by_id in _labelled("retry_after_final_refusal"):
        (reject,) = [s for s in _steps(plan, h.handoff_id) if s.event == "reject"]
        assert reject.attrs["error_code"] in ("permission_denied", "capability_not_granted")
        prev = h.envelope.get("retry_of") or next(
            x.handoff_id
            for x in plan.handoffs
            if x is not h and x.envelope["objective"] == h.envelope["objective"]
        )
        first = [s for s in _steps(plan, prev) if s.event == "reject"]
        assert first[0].attrs["error_code"] == reject.attrs["error_code"]
        assert first[0].at_ns < h.created_ns


def test_keyless_duplicate_is_the_same_payload_without_a_key_both_committed():
    for plan, h, _by_id in _labelled("keyless_duplicate_write"):
        e = h.envelope
        assert e["idempotency_key"] is None
        assert e["message_kind"] == "command" or plan.topology == "shared_queue"
        (first,) = [
            x
            for x in plan.handoffs
            if x is not h and x.envelope["payload_hash"] == e["payload_hash"]
        ]
        assert first.envelope["idempotency_key"] is None
        assert 0 < h.created_ns - first.created_ns <= 600 * S
        for x in (first, h):
            assert "commit" in [s.event for s in _steps(plan, x.handoff_id)]


def test_grants_and_versions_change_only_their_own_field():
    for _plan, h, _ in _labelled("grant_caller_mismatch"):
        g = h.envelope["grant"]
        assert g["caller"] != h.envelope["from_agent"] and g["tenant"] == h.tenant
    for _plan, h, _ in _labelled("missing_grant"):
        assert h.envelope["grant"] == {} and h.envelope["capabilities"]
    for plan, h, _ in _labelled("out_of_order_version"):
        accept = next(s for s in _steps(plan, h.handoff_id) if s.event == "accept")
        assert accept.attrs["state_version"] == h.envelope["state_version"] - 1
