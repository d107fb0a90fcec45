"""The pure half of the simulator: plans tasks of handoffs as timed steps, no I/O.

`plan_task(config, seq, start_ns)` returns one TaskPlan (start times: _arrivals.py; the
fleet: _catalog.py). Each task draws from its own random.Random seeded by (config.seed, seq), so a plan is
reproducible and independent of how many tasks come before it. Every step sequence is legal
under collector.contract except steps marked `illegal` (the after_terminal fault).
"""

from __future__ import annotations

import hashlib
import math
import random
from types import MappingProxyType
from typing import Any, Final

from collector.contract import TERMINAL, next_state
from handoffs.simulator._catalog import (
    ACCEPT_MS,
    AGENTS,
    DEADLINE_MS,
    SPECIALISTS,
    TOPOLOGIES,
    TOPOLOGY_WEIGHTS,
    WORKFLOW_WEIGHTS,
    WORKFLOWS,
    Hop,
)
from handoffs.simulator._model import (
    PlannedHandoff,
    ScenarioConfig,
    SimulatorConfigError,
    Step,
    TaskPlan,
)

__all__ = ["plan_task"]

_MS: Final = 1_000_000


def _lognormal(rng: random.Random, median: float, sigma: float = 0.6) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


class _Builder:
    """Accumulates the handoffs and steps of one task while tracking each handoff's state."""

    def __init__(
        self, cfg: ScenarioConfig, rng: random.Random, task_id: str, tenant: str, topology: str
    ):
        self.cfg, self.rng = cfg, rng
        self.task_id, self.tenant, self.topology = task_id, tenant, topology
        self.handoffs: list[PlannedHandoff] = []
        self.steps: list[Step] = []
        self.state: dict[str, str] = {}
        self.version = rng.randint(1, 50)  # the task's optimistic state version
        self.fence = rng.randint(1, 1000)  # the task's lease fence token
        self.n_attempts = 0
        self.last_hid: str | None = None  # the handoff that caused the next one

    def ms(self, median_ms: float) -> int:
        """A latency in ns drawn around median_ms, scaled by config.latency_scale; >= 1 ms."""
        return max(_MS, int(_lognormal(self.rng, median_ms) * self.cfg.latency_scale * _MS))

    def create(
        self,
        hop: Hop,
        at: int,
        *,
        key: str | None = None,
        payload_salt: str = "",
        faults: frozenset[str] = frozenset(),
    ) -> str:
        self.n_attempts += 1
        hid = f"{self.task_id}-h{self.n_attempts}-{self.rng.getrandbits(32):08x}"
        objective = hop.objective.format(n=self.rng.randint(100, 9999))
        payload_hash = (
            "sha256:" + hashlib.sha256(f"{objective}|{payload_salt}".encode()).hexdigest()[:32]
        )
        env: dict[str, Any] = {
            "task_id": self.task_id,
            "handoff_id": hid,
            "from_agent": hop.from_agent,
            "to_agent": hop.to_agent,
            "mode": hop.mode,
            "objective": objective,
            "capabilities": hop.capabilities,
            "idempotency_key": key or f"{self.task_id}:{hop.to_agent}:{self.n_attempts}",
            "deadline_ms": DEADLINE_MS[self.topology],
            "topology": self.topology,
            "state_version": self.version,
            "fence_token": self.fence,
            "payload_hash": payload_hash,
            "contract_version": "2026-11",
            "reply_contract": "result+evidence",
            "max_tool_calls": 8 if hop.mode == "consult" else 40,
            "constraints": {
                "budget_usd": 2 if hop.mode == "consult" else 10,
                "pii": hop.to_agent in ("support", "billing"),
            },
            "parent_state": "running",
            "causation_id": self.last_hid,
        }
        self.handoffs.append(PlannedHandoff(self.tenant, MappingProxyType(env), at, faults))
        self.steps.append(Step(hid, "create", at, hop.from_agent))
        self.state[hid] = "created"
        self.last_hid = hid
        return hid

    def step(self, hid: str, event: str, at: int, actor: str, **attrs: Any) -> int:
        self.state[hid] = next_state(self.state[hid], event).value  # raises if the plan is illegal
        self.steps.append(Step(hid, event, at, actor, MappingProxyType(attrs)))
        return at

    def evidence(self, hid: str, valid: bool) -> dict[str, Any]:
        n = 2 + self.rng.randrange(3) if valid else 1
        refs = [
            f"{kind}:{hid[-8:]}-{i}"
            for i, kind in zip(range(n), ("doc", "test", "log", "run", "url"), strict=False)
        ]
        return {"evidence_count": n, "evidence_valid": valid, "evidence_refs": refs}

    def receipt(self, hid: str, *, stale_version: bool, stale_fence: bool) -> dict[str, Any]:
        return {
            "receipt_status": "ok",
            "receipt_hash": "sha256:" + hashlib.sha256(hid.encode()).hexdigest(),
            "result_version": f"v{self.version + 1}",
            "state_version": self.version - 1 if stale_version else self.version,
            "fence_token": self.fence - 1 if stale_fence else self.fence,
            "execution_id": f"exec-{hid[-8:]}",
            "execution_version": "agent-2026.11",
        }


def _attempt(
    b: _Builder,
    hop: Hop,
    t0: int,
    *,
    outcome: str,
    overlays: frozenset[str],
    key: str | None = None,
    payload_salt: str = "",
) -> tuple[str, int]:
    """Plan one handoff attempt from t0 with the given outcome; return (handoff_id, end_ns)."""
    labels = set(overlays)
    if outcome != "success":
        labels.add(outcome)
    hid = b.create(hop, t0, key=key, payload_salt=payload_salt, faults=frozenset())
    snd, rcv = hop.from_agent, hop.to_agent
    deadline_ns = DEADLINE_MS[b.topology] * _MS
    run_ns = min(b.ms(AGENTS[rcv][1] * 1000), int(deadline_ns * 0.7))
    t = t0
    commit_step: int | None = None
    if outcome in ("reject", "skill_removed"):
        code = (
            "capability_not_found"
            if outcome == "skill_removed"
            else b.rng.choice(("busy", "policy"))
        )
        t = b.step(hid, "reject", t + b.ms(ACCEPT_MS[b.topology]), rcv, error_code=code)
    elif outcome == "expire":
        t = b.step(hid, "expire", t0 + deadline_ns, snd, error_code="not_accepted")
    else:
        t = b.step(hid, "accept", t + b.ms(ACCEPT_MS[b.topology]), rcv)
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
            t = b.step(hid, "timeout", max(t0 + deadline_ns, t + _MS), snd, error_code="deadline")
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
                        **b.evidence(hid, True),
                        **b.receipt(hid, stale_version=False, stale_fence=False),
                    )
                else:
                    t = b.step(hid, "resolve_failed", late, rcv, error_code="receiver_crashed")
            elif u < rates.timeout_resolve + rates.timeout_escalate:
                labels.add("timeout_escalated")
                t = b.step(hid, "escalate", t + b.ms(60_000), snd, error_code="unknown_outcome")
            else:
                labels.add("timeout_unresolved")
            labels.discard("timeout")
        elif outcome == "commit_fail":
            # a result with valid evidence, then the write fails (conflict): E and V, not K
            t = b.step(hid, "prepare", t + run_ns, rcv, **b.evidence(hid, True))
            t = b.step(hid, "fail", t + b.ms(200), rcv, error_code="commit_conflict")
        else:  # success or partial_result: a result, then a commit
            valid = outcome != "partial_result"
            ev = b.evidence(hid, valid)
            if b.rng.random() < 0.5:
                t = b.step(hid, "prepare", t + run_ns, rcv, **ev)
                t = b.step(
                    hid,
                    "commit",
                    t + b.ms(200),
                    rcv,
                    **ev,
                    **b.receipt(
                        hid,
                        stale_version="stale_state_version" in overlays,
                        stale_fence="stale_fence" in overlays,
                    ),
                )
            else:
                t = b.step(
                    hid,
                    "commit",
                    t + run_ns,
                    rcv,
                    **ev,
                    **b.receipt(
                        hid,
                        stale_version="stale_state_version" in overlays,
                        stale_fence="stale_fence" in overlays,
                    ),
                )
            commit_step = len(b.steps) - 1
            if b.rng.random() < 0.3:
                t = b.step(hid, "verify", t + b.ms(1000), snd, receipt_status="verified")
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
    _relabel(b, hid, labels)
    return hid, t


def _relabel(b: _Builder, hid: str, labels: set[str]) -> None:
    for i, h in enumerate(b.handoffs):
        if h.handoff_id == hid:
            b.handoffs[i] = PlannedHandoff(h.tenant, h.envelope, h.created_ns, frozenset(labels))
            return


def _draw_outcome(b: _Builder, hop: Hop, at: int) -> tuple[str, frozenset[str]]:
    r, rng = b.cfg.rates, b.rng
    u = rng.random()
    outcome = "success"
    acc = 0.0
    for name in ("reject", "expire", "cancel", "fail", "timeout", "partial_result", "commit_fail"):
        acc += getattr(r, name)
        if u < acc:
            outcome = name
            break
    overlays = {
        name
        for name in (
            "bounce",
            "duplicate_delivery",
            "stale_state_version",
            "stale_fence",
            "idempotency_conflict",
            "after_terminal",
        )
        if rng.random() < getattr(r, name)
    }
    if overlays & {"stale_state_version", "stale_fence"} and outcome != "partial_result":
        outcome = "success"  # a stale commit needs a commit
    outage = b.cfg.outage
    if (
        outage
        and outage.covers(hop.to_agent, hop.capabilities, at)
        and rng.random() < outage.reject_rate
    ):
        outcome = "skill_removed"
        overlays -= {"stale_state_version", "stale_fence"}
    return outcome, frozenset(overlays)


def plan_task(config: ScenarioConfig, seq: int, start_ns: int) -> TaskPlan:
    """Plan task number `seq` starting at start_ns (ns since epoch). Pure and deterministic."""
    if start_ns < 0:
        raise SimulatorConfigError("start_ns", "must be >= 0 (ns since the Unix epoch)")
    rng = random.Random(f"{config.seed}:{seq}")
    tenant = rng.choices(list(config.tenants), weights=list(config.tenants.values()))[0]
    topology = rng.choices(TOPOLOGIES, weights=TOPOLOGY_WEIGHTS)[0]
    _, _, hops = rng.choices(WORKFLOWS, weights=WORKFLOW_WEIGHTS)[0]
    task_id = f"{config.id_prefix}t{seq:x}-{rng.getrandbits(32):08x}"
    b = _Builder(config, rng, task_id, tenant, topology)
    t = start_ns
    for hop in hops:
        outcome, overlays = _draw_outcome(b, hop, t)
        if "bounce" in overlays:
            wrong = rng.choice([a for a in SPECIALISTS if a not in (hop.from_agent, hop.to_agent)])
            first = Hop(hop.from_agent, wrong, "transfer", hop.capabilities, hop.objective)
            h1 = b.create(first, t, faults=frozenset({"bounce"}))
            t = b.step(h1, "accept", t + b.ms(ACCEPT_MS[topology]), wrong)
            t = b.step(h1, "start", t + b.ms(30), wrong)
            back = Hop(wrong, hop.from_agent, "transfer", (), "not mine: " + hop.objective)
            t += b.ms(3000)
            h2 = b.create(back, t)
            b.step(h1, "fail", t + b.ms(20), wrong, error_code="wrong_specialist")
            t = b.step(h2, "accept", t + b.ms(ACCEPT_MS[topology]), hop.from_agent)
            t = b.step(h2, "start", t + b.ms(20), hop.from_agent)
            t = b.step(
                h2,
                "commit",
                t + b.ms(500),
                hop.from_agent,
                **b.evidence(h2, True),
                **b.receipt(h2, stale_version=False, stale_fence=False),
            )
            b.version += 1
            t += b.ms(1000)
        key = None
        if "idempotency_conflict" in overlays:
            # first send canceled, retried under the same key with a changed payload
            key = f"{task_id}:{hop.to_agent}:retry"
            h0 = b.create(hop, t, key=key, payload_salt="v1")
            t = b.step(h0, "cancel", t + b.ms(2000), hop.from_agent, error_code="payload_changed")
            t += b.ms(500)
        hid, t = _attempt(
            b,
            hop,
            t,
            outcome=outcome,
            overlays=overlays - {"bounce"},
            key=key,
            payload_salt="v2" if key else "",
        )
        if "idempotency_conflict" in overlays:
            _add_label(b, hid, "idempotency_conflict")
        t += b.ms(2000)  # think time before the next hop
        b.fence += 1
    steps = tuple(sorted(b.steps, key=lambda s: s.at_ns))
    return TaskPlan(task_id, tenant, topology, tuple(b.handoffs), steps, len(hops))


def _add_label(b: _Builder, hid: str, label: str) -> None:
    for i, h in enumerate(b.handoffs):
        if h.handoff_id == hid:
            b.handoffs[i] = PlannedHandoff(h.tenant, h.envelope, h.created_ns, h.faults | {label})
            return
