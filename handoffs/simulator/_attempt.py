"""One handoff attempt planned from its drawn outcome, and the draws that decide it.

`attempt()` plans one attempt (create, then the steps of its outcome and overlays) on a
Builder; `draw_outcome` / `draw_audit` draw what happens to an intent; `shape_for` turns an
envelope or receiver audit kind into how the attempt deviates. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from collector import semconv as sc
from collector.contract import TERMINAL
from handoffs.simulator._budget import draw_budget, overrun_run_ns
from handoffs.simulator._builder import (
    MS,
    RECEIPT_TTL_NS,
    VERIFY_P_LAST,
    Builder,
    S,
    iso_s,
)
from handoffs.simulator._catalog import (
    ACCEPT_MS,
    AGENTS,
    DEADLINE_MS,
    SPECIALISTS,
    TOPOLOGY_FAULTS,
    Hop,
)
from handoffs.simulator._evidence import RESULT_OUTCOMES, draw_evidence, evidence_labels
from handoffs.simulator._model import (
    AUDIT_KINDS,
    CHAINED_KINDS,
    EVIDENCE_FAULTS,
    ScenarioConfig,
    Step,
)

#: Faults that shape an attempt's topology attributes (Builder traits).
_TRAITS: Final = frozenset(
    {
        "unfiltered_sensitive_history",
        "partial_result",
        "partial_result_committed",
        "consumer_lag",
        "stale_agent_card",
        "tool_budget_exceeded",
        "ack_missing",
        *EVIDENCE_FAULTS,
    }
)
#: Faults drawn only in their own topology.
_OWNED: Final = frozenset(f for faults in TOPOLOGY_FAULTS.values() for f in faults)

__all__ = ["Result", "Shape", "attempt", "draw_audit", "draw_outcome", "impostor", "shape_for"]


@dataclass(frozen=True, slots=True)
class Shape:
    """How one attempt deviates for an audit kind (all defaults: an ordinary attempt)."""

    receiver: str | None = None  # another agent than to_agent plays the receiver
    grant: Mapping[str, Any] | None = None  # grant attributes replacing the ordinary ones
    accept_claim: str | None = None  # the accept span claims this tenant
    receipt_ttl_ns: int = RECEIPT_TTL_NS
    verify: str = "draw"  # "draw" (verify_p), "now", "never", "later" (the caller plans it)


@dataclass(frozen=True, slots=True)
class Result:
    hid: str
    end_ns: int
    commit_ns: int | None  # when it committed (None: it did not)
    verified: bool  # read back before end_ns
    state: str


def attempt(
    b: Builder,
    hop: Hop,
    t0: int,
    *,
    outcome: str,
    overlays: frozenset[str],
    key: str | None = None,
    payload_salt: str = "",
    causation: str | None = None,
    retry_of: str | None = None,
    label: str | None = None,
    verify_p: float = VERIFY_P_LAST,
    shape: Shape = Shape(),
) -> Result:
    """Plan one handoff attempt from t0 with the given outcome."""
    labels = set(overlays)
    if outcome not in ("success", "blind_first"):
        labels.add(outcome)
    if label is not None:
        labels.add(label)
    labels = evidence_labels(outcome, labels)  # a result to check, and whose claim
    hid = b.create(
        hop,
        t0,
        key=key,
        payload_salt=payload_salt,
        causation=causation,
        retry_of=retry_of,
        grant=shape.grant,
        traits=frozenset(labels & _TRAITS),
    )
    snd, rcv = hop.from_agent, shape.receiver or hop.to_agent
    deadline_ns = DEADLINE_MS[b.topology] * MS
    run_ns = min(b.ms(AGENTS[hop.to_agent][1] * 1000), int(deadline_ns * 0.7))
    if "deadline_overrun" in overlays:
        run_ns = overrun_run_ns(deadline_ns)  # the work outlasts the whole deadline
    t = t0
    commit_step: int | None = None
    commit_ns: int | None = None
    verified = False
    if outcome == "skill_removed" and b.topology == "federated_a2a":
        labels.add("card_skill_refused")  # the sender's fresh card still lists the skill
    if outcome == "expire" and b.topology == "shared_queue":
        labels.add("consumer_stalled")  # nobody took it off the queue: the consumer stalled
    if outcome in ("reject", "skill_removed", "stale_agent_card", "card_skill_refused"):
        code = (
            "unknown_capability"
            if outcome in ("skill_removed", "stale_agent_card", "card_skill_refused")
            else b.rng.choice(("busy", "permission_denied", "budget_exceeded", "policy"))
        )
        t = b.step(hid, "reject", t + b.ms(ACCEPT_MS[b.topology]), rcv, error_code=code)
    elif outcome == "consumer_stalled":
        # enqueued for a consumer that stopped: nobody takes it; the sender gives up
        t = b.step(hid, "expire", t0 + deadline_ns, snd, error_code="not_accepted")
    elif outcome == "expire":
        t = b.step(hid, "expire", t0 + deadline_ns, snd, error_code="not_accepted")
    else:
        # the receiver names its tenant on the accept (a claim: the credential decides)
        claim = {"extra": {sc.TENANT: shape.accept_claim or b.tenant}}
        t = b.step(hid, "accept", b.accept_at(hid, t), rcv, **claim)
        t = b.step(hid, "start", t + b.ms(30), rcv)
        if outcome == "cancel":
            t = b.step(hid, "cancel", t + run_ns // 3, snd, error_code="superseded")
        elif outcome == "fail":
            t = b.step(
                hid,
                "fail",
                t + run_ns,
                rcv,
                error_code=b.rng.choice(("tool_error", "model_refusal")),
            )
        elif outcome == "timeout":
            t = b.step(hid, "timeout", max(t0 + deadline_ns, t + MS), snd, error_code="deadline")
            u = b.rng.random()
            rates = b.cfg.rates
            if u < rates.timeout_resolve:
                labels.add("timeout_resolved")
                late = t + b.ms(240_000)
                if b.rng.random() < 0.7:
                    t = b.step(
                        hid,
                        "resolve_committed",
                        late,
                        rcv,
                        **b.result(hid, late, True, stale_version=False, stale_fence=False),
                    )
                else:
                    t = b.step(hid, "resolve_failed", late, rcv, error_code="receiver_crashed")
            elif u < rates.timeout_resolve + rates.timeout_escalate:
                labels.add("timeout_escalated")
                t = b.step(hid, "escalate", t + b.ms(60_000), snd, error_code="unknown_outcome")
            else:
                labels.add("timeout_unresolved")
            labels.discard("timeout")
        elif outcome == "blind_first":
            # the sender's deadline passes; the retry is sent before anyone resolves this one
            t = b.step(hid, "timeout", max(t0 + deadline_ns, t + MS), snd, error_code="deadline")
        elif outcome == "commit_fail":
            # a result with valid evidence, then the write fails (conflict): E and V, not K
            at = t + run_ns
            ev = b.evidence(hid, True, at)
            t = b.step(hid, "prepare", at, rcv, **ev)
            t = b.step(hid, "fail", t + b.ms(200), rcv, error_code="conflict")
        else:  # success or partial_result: a result, then a commit
            valid = outcome != "partial_result"
            stale = {
                "stale_version": "stale_state_version" in overlays,
                "stale_fence": "stale_fence" in overlays,
                "ttl_ns": shape.receipt_ttl_ns,
            }
            if b.rng.random() < 0.5:
                at = t + run_ns
                t = b.step(hid, "prepare", at, rcv, **b.evidence(hid, valid, at))
                at = t + b.ms(200)
            else:
                at = t + run_ns
            t = b.step(hid, "commit", at, rcv, **b.result(hid, at, valid, **stale))
            commit_step, commit_ns = len(b.steps) - 1, t
            verify = shape.verify
            if verify == "draw":
                verify = "now" if b.rng.random() < verify_p else "never"
            if verify == "now":
                t = b.verify(hid, t + b.ms(1000), snd)
                verified = True
            b.version += 1
    if "duplicate_delivery" in overlays:
        # a write retried without a dedup key: the commit (else the last step) arrives twice
        src = b.steps[commit_step] if commit_step is not None else b.steps[-1]
        t = max(t, src.at_ns) + b.ms(500)
        b.steps.append(Step(hid, "redeliver", t, src.actor))
    if "after_terminal" in overlays:
        # a late worker message to a finished handoff: illegal, emitted by a lenient tracer
        t += b.ms(5000)
        b.steps.append(Step(hid, "start", t, rcv, illegal=True))
        if b.state[hid] not in TERMINAL and b.state[hid] != "unknown":
            raise AssertionError("after_terminal planned on a live handoff")  # planner bug
    b.relabel(hid, labels)
    return Result(hid, t, commit_ns, verified, b.state[hid])


def draw_outcome(b: Builder, hop: Hop, at: int) -> tuple[str, frozenset[str]]:
    """An intent's exclusive outcome and its overlay faults; a topology's own faults only in
    that topology (TOPOLOGY_FAULTS)."""
    r, rng = b.cfg.rates, b.rng
    own = TOPOLOGY_FAULTS[b.topology]
    u = rng.random()
    outcome = "success"
    acc = 0.0
    for name in ("reject", "expire", "cancel", "fail", "timeout", "partial_result", "commit_fail"):
        if name == "partial_result" and name not in own:
            continue
        acc += getattr(r, name)
        if u < acc:
            outcome = name
            break
    drawn = (
        "bounce",
        "duplicate_delivery",
        "stale_state_version",
        "stale_fence",
        "idempotency_conflict",
        "after_terminal",
        "unfiltered_sensitive_history",
        "partial_result_committed",
        "consumer_lag",
        "stale_agent_card",
        "card_skill_refused",
        "consumer_stalled",
    )
    overlays = {
        name
        for name in drawn
        if (name not in _OWNED or name in own)
        and (name != "unfiltered_sensitive_history" or hop.mode == "transfer")
        and rng.random() < getattr(r, name)
    }
    if overlays & {"stale_state_version", "stale_fence", "partial_result_committed"}:
        if outcome != "partial_result":
            outcome = "success"  # a stale or partial commit needs a commit
        if outcome == "partial_result":
            overlays.discard("partial_result_committed")  # a partial result is one or other
    if "consumer_lag" in overlays and outcome in ("reject", "expire"):
        outcome = "success"  # a lagging consumer takes the message, late
    overlays |= draw_budget(rng, r)  # nothing drawn at rate 0
    if overlays & {"deadline_overrun", "tool_budget_exceeded"} and outcome not in (
        "success",
        "partial_result",
    ):
        outcome = "success"  # a result, to come late or over budget
    if "ack_missing" in overlays and outcome in ("reject", "expire"):
        outcome = "success"  # the message is taken, after its ttl
    overlays |= draw_evidence(rng, r)  # nothing drawn at rate 0
    if overlays & set(EVIDENCE_FAULTS) and outcome not in RESULT_OUTCOMES:
        outcome = "success"  # a result, to check against the envelope's policy and contract
    if "stale_agent_card" in overlays:
        overlays.discard("stale_agent_card")
        outcome = "stale_agent_card"  # the card's skill is gone: rejected
        overlays -= {"stale_state_version", "stale_fence", "duplicate_delivery"}
    if "card_skill_refused" in overlays:
        overlays.discard("card_skill_refused")
        if outcome != "stale_agent_card":
            outcome = "card_skill_refused"  # the fresh card lists it; the agent refuses it
            overlays -= {"stale_state_version", "stale_fence", "duplicate_delivery"}
    if "consumer_stalled" in overlays:
        overlays.discard("consumer_stalled")
        outcome = "consumer_stalled"  # never taken: no lag, no result, nothing to deliver
        overlays -= {"stale_state_version", "stale_fence", "duplicate_delivery", "consumer_lag"}
    outage = b.cfg.outage
    if (
        outcome not in ("stale_agent_card", "card_skill_refused", "consumer_stalled")
        and outage
        and outage.covers(hop.to_agent, hop.capabilities, at)
        and rng.random() < outage.reject_rate
    ):
        outcome = "skill_removed"
        overlays -= {"stale_state_version", "stale_fence", "partial_result_committed"}
    return outcome, frozenset(overlays)


def draw_audit(cfg: ScenarioConfig, rng: random.Random, position: int, n: int) -> str | None:
    """At most one audit kind for the hop at `position` of an n-hop task; the chained kinds
    only where a previous hop exists, at rate x n/(n-1) (a rate per intent over the task)."""
    u = rng.random()
    acc = 0.0
    for kind in AUDIT_KINDS:
        rate = getattr(cfg.rates, kind)
        if kind in CHAINED_KINDS:
            rate = rate * n / (n - 1) if position > 0 else 0.0
        acc += rate
        if u < acc:
            return kind
    return None


def other_tenant(b: Builder) -> str:
    others = sorted(t for t in b.cfg.tenants if t != b.tenant)
    return b.rng.choice(others) if others else f"{b.tenant}-partner"


def impostor(b: Builder, hop: Hop) -> str:
    return b.rng.choice([a for a in SPECIALISTS if a not in (hop.from_agent, hop.to_agent)])


def shape_for(b: Builder, hop: Hop, kind: str | None, at: int) -> Shape:
    """The deviation of an attempt created at `at` for the envelope and receiver kinds."""
    if kind == "wrong_consumer":
        return Shape(receiver=impostor(b, hop))
    if kind == "grant_expired":
        # a grant issued earlier and reused after it lapsed
        return Shape(grant=b.grant(hop, at, expires_at=iso_s(at - 600 * S)))
    if kind == "capability_outside_grant":
        granted = [c for c in b.grant(hop, at)["capabilities"] if c != hop.capabilities[0]]
        return Shape(grant=b.grant(hop, at, capabilities=granted or ["docs.read"]))
    if kind == "grant_tenant_mismatch":
        return Shape(grant=b.grant(hop, at, tenant=other_tenant(b)))
    if kind == "tenant_claim_mismatch":
        return Shape(accept_claim=other_tenant(b))
    return Shape()
