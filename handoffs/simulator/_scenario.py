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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from collector import semconv as sc
from collector.contract import TERMINAL, next_state
from collector.envelope import EvidenceRef
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
    AUDIT_KINDS,
    CHAINED_KINDS,
    PlannedHandoff,
    ScenarioConfig,
    SimulatorConfigError,
    Step,
    TaskPlan,
)

__all__ = ["plan_task"]

_MS: Final = 1_000_000
_S: Final = 1_000_000_000
#: How long an ordinary grant and an ordinary receipt stay valid, ns.
GRANT_TTL_NS: Final = 6 * 3600 * _S
RECEIPT_TTL_NS: Final = 24 * 3600 * _S
#: expired_receipt_used: the receipt lives this long; the consumer comes CONSUME_LATE_NS
#: after the commit (margins of whole seconds: expiry times travel with second precision)
SHORT_RECEIPT_TTL_NS: Final = 30 * _S
CONSUME_LATE_NS: Final = 120 * _S
#: Probability that a committed result is read back (verify) before the next hop, and
#: after the last hop of a task. The next hop names a result as its causation only when
#: it was verified first.
VERIFY_P_NEXT: Final = 0.8
VERIFY_P_LAST: Final = 0.3
#: Probability an attempt that failed (or whose unknown outcome resolved failed) is retried
#: once under the same idempotency key (an ordinary, informed retry).
RETRY_AFTER_FAIL_P: Final = 0.5


_CLAIMS: Final = {
    "doc": "source read",
    "test": "tests pass",
    "log": "log excerpt",
    "run": "run output",
    "url": "page cited",
}


def iso_s(t_ns: int) -> str:
    """ISO-8601 UTC with whole seconds (rounded down), e.g. 2026-12-01T10:00:00Z."""
    return datetime.fromtimestamp(t_ns // _S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        self.subject = f"user:{tenant}-{rng.randint(1000, 9999)}"  # on whose behalf the task runs
        self.envelopes: dict[str, dict[str, Any]] = {}

    def ms(self, median_ms: float) -> int:
        """A latency in ns drawn around median_ms, scaled by config.latency_scale; >= 1 ms."""
        return max(_MS, int(_lognormal(self.rng, median_ms) * self.cfg.latency_scale * _MS))

    def grant(self, hop: Hop, at: int, **over: Any) -> dict[str, Any]:
        """The capability grant of an ordinary handoff (collector.Grant's wire form): the
        sender asks on the task subject's behalf for the target's card capabilities, for
        GRANT_TTL_NS; `over` replaces fields."""
        caps = sorted(set(AGENTS[hop.to_agent][0]) | set(hop.capabilities))
        g: dict[str, Any] = {
            "caller": hop.from_agent,
            "subject": self.subject,
            "tenant": self.tenant,
            "approval": f"policy:{self.tenant}/agents-2026-11",
            "capabilities": caps,
            "resources": [f"{self.tenant}/task/{self.task_id}"],
            "expires_at": iso_s(at + GRANT_TTL_NS),
        }
        g.update(over)
        return g

    def create(
        self,
        hop: Hop,
        at: int,
        *,
        key: str | None = None,
        payload_salt: str = "",
        faults: frozenset[str] = frozenset(),
        causation: str | None = None,
        grant: Mapping[str, Any] | None = None,
        retry_of: str | None = None,
    ) -> str:
        """Plan a `create`; `retry_of` names an earlier attempt whose envelope (key, payload,
        causation, grant) this one repeats with the next attempt number, as the shim's
        `retry()` builds it."""
        self.n_attempts += 1
        hid = f"{self.task_id}-h{self.n_attempts}-{self.rng.getrandbits(32):08x}"
        if retry_of is not None:
            prev = self.envelopes[retry_of]
            env = dict(prev, handoff_id=hid, retry_of=retry_of, attempt=prev["attempt"] + 1)
        else:
            objective = hop.objective.format(n=self.rng.randint(100, 9999))
            payload_hash = (
                "sha256:" + hashlib.sha256(f"{objective}|{payload_salt}".encode()).hexdigest()[:32]
            )
            env = {
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
                "causation_id": causation,
                "attempt": 1,
                "grant": grant if grant is not None else self.grant(hop, at),
            }
        self.envelopes[hid] = env
        self.handoffs.append(PlannedHandoff(self.tenant, MappingProxyType(env), at, faults))
        self.steps.append(Step(hid, "create", at, hop.from_agent))
        self.state[hid] = "created"
        return hid

    def step(self, hid: str, event: str, at: int, actor: str, **attrs: Any) -> int:
        self.state[hid] = next_state(self.state[hid], event).value  # raises if the plan is illegal
        self.steps.append(Step(hid, event, at, actor, MappingProxyType(attrs)))
        return at

    def evidence(self, hid: str, valid: bool, at: int) -> dict[str, Any]:
        """Evidence keyword attributes of a result at `at`: refs with their claim and the
        time each was valid."""
        n = 2 + self.rng.randrange(3) if valid else 1
        kinds = ("doc", "test", "log", "run", "url")[:n]
        seen = iso_s(at - 60 * _S)
        refs = [
            EvidenceRef(f"{kind}:{hid[-8:]}-{i}", _CLAIMS[kind], seen)
            for i, kind in enumerate(kinds)
        ]
        return {"evidence_count": n, "evidence_valid": valid, "evidence_refs": refs}

    def receipt(
        self,
        hid: str,
        at: int,
        *,
        stale_version: bool,
        stale_fence: bool,
        ttl_ns: int = RECEIPT_TTL_NS,
    ) -> dict[str, Any]:
        """Receipt keyword attributes of a commit at `at`: issued id, expiry, versions."""
        return {
            "receipt_status": "ok",
            "receipt_hash": "sha256:" + hashlib.sha256(hid.encode()).hexdigest(),
            "result_version": f"v{self.version + 1}",
            "state_version": self.version - 1 if stale_version else self.version,
            "fence_token": self.fence - 1 if stale_fence else self.fence,
            "execution_id": f"exec-{hid[-8:]}",
            "execution_version": "agent-2026.11",
            "receipt_id": f"rcpt-{hid[-8:]}",
            "receipt_expires_at": iso_s(at + ttl_ns),
        }

    def result(self, hid: str, at: int, valid: bool, **receipt: Any) -> dict[str, Any]:
        """Evidence and receipt of a commit at `at`."""
        return {**self.evidence(hid, valid, at), **self.receipt(hid, at, **receipt)}

    def verify(self, hid: str, at: int, actor: str) -> int:
        """The sender reads the receipt back from the receiver: nothing differs."""
        return self.step(
            hid,
            "verify",
            at,
            actor,
            receipt_status="verified",
            read_back=True,
            conflicts=(),
        )


@dataclass(frozen=True, slots=True)
class _Shape:
    """How one attempt deviates for an audit kind (all defaults: an ordinary attempt)."""

    receiver: str | None = None  # another agent than to_agent plays the receiver
    grant: Mapping[str, Any] | None = None  # grant attributes replacing the ordinary ones
    accept_claim: str | None = None  # the accept span claims this tenant
    receipt_ttl_ns: int = RECEIPT_TTL_NS
    verify: str = "draw"  # "draw" (verify_p), "now", "never", "later" (the caller plans it)


@dataclass(frozen=True, slots=True)
class _Result:
    hid: str
    end_ns: int
    commit_ns: int | None  # when it committed (None: it did not)
    verified: bool  # read back before end_ns
    state: str


def _attempt(
    b: _Builder,
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
    shape: _Shape = _Shape(),
) -> _Result:
    """Plan one handoff attempt from t0 with the given outcome."""
    labels = set(overlays)
    if outcome not in ("success", "blind_first"):
        labels.add(outcome)
    if label is not None:
        labels.add(label)
    hid = b.create(
        hop,
        t0,
        key=key,
        payload_salt=payload_salt,
        causation=causation,
        retry_of=retry_of,
        grant=shape.grant,
    )
    snd, rcv = hop.from_agent, shape.receiver or hop.to_agent
    deadline_ns = DEADLINE_MS[b.topology] * _MS
    run_ns = min(b.ms(AGENTS[hop.to_agent][1] * 1000), int(deadline_ns * 0.7))
    t = t0
    commit_step: int | None = None
    commit_ns: int | None = None
    verified = False
    if outcome in ("reject", "skill_removed"):
        code = (
            "unknown_capability"
            if outcome == "skill_removed"
            else b.rng.choice(("busy", "permission_denied", "budget_exceeded", "policy"))
        )
        t = b.step(hid, "reject", t + b.ms(ACCEPT_MS[b.topology]), rcv, error_code=code)
    elif outcome == "expire":
        t = b.step(hid, "expire", t0 + deadline_ns, snd, error_code="not_accepted")
    else:
        # the receiver names its tenant on the accept (a claim: the credential decides)
        claim = {"extra": {sc.TENANT: shape.accept_claim or b.tenant}}
        t = b.step(hid, "accept", t + b.ms(ACCEPT_MS[b.topology]), rcv, **claim)
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
            t = b.step(hid, "timeout", max(t0 + deadline_ns, t + _MS), snd, error_code="deadline")
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
    _relabel(b, hid, labels)
    return _Result(hid, t, commit_ns, verified, b.state[hid])


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


def _draw_audit(cfg: ScenarioConfig, rng: random.Random, position: int, n: int) -> str | None:
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


def _other_tenant(b: _Builder) -> str:
    others = sorted(t for t in b.cfg.tenants if t != b.tenant)
    return b.rng.choice(others) if others else f"{b.tenant}-partner"


def _impostor(b: _Builder, hop: Hop) -> str:
    return b.rng.choice([a for a in SPECIALISTS if a not in (hop.from_agent, hop.to_agent)])


def _shape(b: _Builder, hop: Hop, kind: str | None, at: int) -> _Shape:
    """The deviation of an attempt created at `at` for the envelope and receiver kinds."""
    if kind == "wrong_consumer":
        return _Shape(receiver=_impostor(b, hop))
    if kind == "grant_expired":
        # a grant issued earlier and reused after it lapsed
        return _Shape(grant=b.grant(hop, at, expires_at=iso_s(at - 600 * _S)))
    if kind == "capability_outside_grant":
        granted = [c for c in b.grant(hop, at)["capabilities"] if c != hop.capabilities[0]]
        return _Shape(grant=b.grant(hop, at, capabilities=granted or ["docs.read"]))
    if kind == "grant_tenant_mismatch":
        return _Shape(grant=b.grant(hop, at, tenant=_other_tenant(b)))
    if kind == "tenant_claim_mismatch":
        return _Shape(accept_claim=_other_tenant(b))
    return _Shape()


def plan_task(config: ScenarioConfig, seq: int, start_ns: int) -> TaskPlan:
    """Plan task number `seq` starting at start_ns (ns since epoch). Pure and deterministic.

    A hop names the previous hop's committed attempt as its causation only when that result
    was read back (verified) before the hop was created, except where an audit kind says
    otherwise (consumed_before_verified, expired_receipt_used).
    """
    if start_ns < 0:
        raise SimulatorConfigError("start_ns", "must be >= 0 (ns since the Unix epoch)")
    rng = random.Random(f"{config.seed}:{seq}")
    tenant = rng.choices(list(config.tenants), weights=list(config.tenants.values()))[0]
    topology = rng.choices(TOPOLOGIES, weights=TOPOLOGY_WEIGHTS)[0]
    _, _, hops = rng.choices(WORKFLOWS, weights=WORKFLOW_WEIGHTS)[0]
    task_id = f"{config.id_prefix}t{seq:x}-{rng.getrandbits(32):08x}"
    b = _Builder(config, rng, task_id, tenant, topology)
    n = len(hops)
    audit = [_draw_audit(config, rng, j, n) for j in range(n)]
    t = start_ns
    producer: _Result | None = None  # the previous hop's committed attempt
    for j, hop in enumerate(hops):
        kind = audit[j]
        after = audit[j + 1] if j + 1 < n else None
        outcome, overlays = _draw_outcome(b, hop, t)
        if kind is not None or after in CHAINED_KINDS:
            # an audit intent, or the producer an audit consumer needs: a clean success
            outcome, overlays = "success", frozenset()
        verify_p = VERIFY_P_NEXT if j + 1 < n else VERIFY_P_LAST
        # the attempt the next hop consumes: read back late, or with a short-lived receipt
        feeds: dict[str, Any] = {}
        if after == "consumed_before_verified":
            feeds = {"verify": "later"}
        elif after == "expired_receipt_used":
            feeds = {"verify": "now", "receipt_ttl_ns": SHORT_RECEIPT_TTL_NS}
        causation = producer.hid if producer is not None and producer.verified else None
        if kind in CHAINED_KINDS:
            if producer is None or producer.commit_ns is None:
                raise AssertionError("a chained audit kind without a committed producer")
            causation = producer.hid
            if kind == "consumed_before_verified":
                # the receipt is read back only after this hop already consumed it
                b.verify(producer.hid, t + b.ms(1500), hops[j - 1].from_agent)
            else:
                t = max(t, producer.commit_ns + CONSUME_LATE_NS)
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
            at = t + b.ms(500)
            t = b.step(
                h2,
                "commit",
                at,
                hop.from_agent,
                **b.result(h2, at, True, stale_version=False, stale_fence=False),
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
        common: dict[str, Any] = {"key": key, "payload_salt": "v2" if key else ""}
        if kind == "blind_retry":
            a1 = _attempt(
                b, hop, t, outcome="blind_first", overlays=frozenset(), causation=causation
            )
            res = _attempt(
                b,
                hop,
                a1.end_ns + b.ms(1000),
                outcome="success",
                overlays=frozenset(),
                retry_of=a1.hid,
                label=kind,
                verify_p=verify_p,
                shape=_Shape(**feeds),
            )
            # the first attempt's outcome is learned only after the retry went out
            b.step(
                a1.hid, "resolve_failed", res.end_ns + b.ms(5000), hop.to_agent,
                error_code="superseded",
            )  # fmt: skip
        elif kind == "duplicate_execution":
            a1 = _attempt(
                b,
                hop,
                t,
                outcome="success",
                overlays=frozenset(),
                causation=causation,
                shape=_Shape(verify="never"),
            )
            # the receipt was lost on its way back: the sender sends the same key again,
            # and the receiver runs it a second time instead of answering from its record
            res = _attempt(
                b,
                hop,
                a1.end_ns + b.ms(3000),
                outcome="success",
                overlays=frozenset(),
                retry_of=a1.hid,
                label=kind,
                verify_p=verify_p,
                shape=_Shape(**feeds),
            )
        else:
            res = _attempt(
                b,
                hop,
                t,
                outcome=outcome,
                overlays=overlays - {"bounce"},
                causation=causation,
                label=kind,
                verify_p=verify_p,
                shape=replace(_shape(b, hop, kind, t), **feeds),
                **common,
            )
            if (
                kind is None
                and res.state == "failed"
                and outcome != "commit_fail"
                and not overlays
                and rng.random() < RETRY_AFTER_FAIL_P
            ):
                # an informed retry: the outcome is known (failed), same key and payload
                res = _attempt(
                    b,
                    hop,
                    res.end_ns + b.ms(2000),
                    outcome="success",
                    overlays=frozenset(),
                    retry_of=res.hid,
                    verify_p=verify_p,
                )
        if "idempotency_conflict" in overlays:
            _add_label(b, res.hid, "idempotency_conflict")
        t = res.end_ns + b.ms(2000)  # think time before the next hop
        producer = res if res.commit_ns is not None else None
        b.fence += 1
    steps = tuple(sorted(b.steps, key=lambda s: s.at_ns))
    return TaskPlan(task_id, tenant, topology, tuple(b.handoffs), steps, len(hops))


def _add_label(b: _Builder, hid: str, label: str) -> None:
    for i, h in enumerate(b.handoffs):
        if h.handoff_id == hid:
            b.handoffs[i] = PlannedHandoff(h.tenant, h.envelope, h.created_ns, h.faults | {label})
            return
