"""The planner's builder: one task's handoffs and steps, tracking each handoff's state.

`Builder` creates envelopes (as the shim's `create` / `retry` would), plans legal
transitions (collector.contract raises on an illegal one), and draws latencies, evidence
and receipts from the task's own random.Random. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from collector import ResultItems
from collector.contract import next_state
from collector.envelope import EvidenceRef
from handoffs.simulator._budget import late_ack_ns, message_fields, tool_calls
from handoffs.simulator._catalog import ACCEPT_MS, AGENTS, DEADLINE_MS, Hop
from handoffs.simulator._evidence import contract_fields, result_contract
from handoffs.simulator._model import PlannedHandoff, ScenarioConfig, Step
from handoffs.simulator._topology import (
    card_ref,
    consumer_window,
    enqueued,
    history_report,
    lag_ns,
    queue_position,
    result_items,
    v2_fields,
)

__all__ = [
    "CONSUME_LATE_NS",
    "GRANT_TTL_NS",
    "MS",
    "RECEIPT_TTL_NS",
    "RETRY_AFTER_FAIL_P",
    "SHORT_RECEIPT_TTL_NS",
    "VERIFY_P_LAST",
    "VERIFY_P_NEXT",
    "Builder",
    "S",
    "iso_s",
]

MS: Final = 1_000_000
S: Final = 1_000_000_000
#: How long an ordinary grant and an ordinary receipt stay valid, ns.
GRANT_TTL_NS: Final = 6 * 3600 * S
RECEIPT_TTL_NS: Final = 24 * 3600 * S
#: expired_receipt_used: the receipt lives this long; the consumer comes CONSUME_LATE_NS
#: after the commit (margins of whole seconds: expiry times travel with second precision)
SHORT_RECEIPT_TTL_NS: Final = 30 * S
CONSUME_LATE_NS: Final = 120 * S
#: Probability that a committed result is read back (verify) before the next hop, and
#: after the last hop of a task. The next hop names a result as its causation only when
#: it was verified first.
VERIFY_P_NEXT: Final = 0.8
VERIFY_P_LAST: Final = 0.3
#: Probability an attempt that failed (or whose unknown outcome resolved failed) is retried
#: once under the same idempotency key (an ordinary, informed retry).
RETRY_AFTER_FAIL_P: Final = 0.5


_RESULT_EVENTS: Final = frozenset({"prepare", "commit", "resolve_committed"})
_CLAIMS: Final = {
    "doc": "source read",
    "test": "tests pass",
    "log": "log excerpt",
    "run": "run output",
    "url": "page cited",
}


def iso_s(t_ns: int) -> str:
    """ISO-8601 UTC with whole seconds (rounded down), e.g. 2026-12-01T10:00:00Z."""
    return datetime.fromtimestamp(t_ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lognormal(rng: random.Random, median: float, sigma: float = 0.6) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


class Builder:
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
        # per handoff: the faults shaping its topology attributes, its create attributes,
        # its result items (agent-as-tool) and whether it is a replayed copy
        self.traits: dict[str, frozenset[str]] = {}
        self.on_create: dict[str, dict[str, Any]] = {}
        self.items: dict[str, ResultItems] = {}
        self.replayed: set[str] = set()

    def ms(self, median_ms: float) -> int:
        """A latency in ns drawn around median_ms, scaled by config.latency_scale; >= 1 ms."""
        return max(MS, int(_lognormal(self.rng, median_ms) * self.cfg.latency_scale * MS))

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
        traits: frozenset[str] = frozenset(),
        keyless: bool = False,
    ) -> str:
        """Plan a `create`; `retry_of` names an earlier attempt whose envelope (key, payload,
        causation, grant) this one repeats with the next attempt number, as the shim's
        `retry()` builds it (the shim's retry carries no history or card). `traits`: the
        topology faults of this attempt (its history, Agent Card, queue position and result
        items follow them). `keyless`: no idempotency key at all."""
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
                "idempotency_key": None
                if keyless
                else key or f"{self.task_id}:{hop.to_agent}:{self.n_attempts}",
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
        if retry_of is not None:
            self.traits[hid] = self.traits[retry_of]
            wire = dict(self.on_create[retry_of])
            if "enqueued" in wire:  # a new message: the queue's position now
                wire["enqueued"] = enqueued(self.queue_name(env), at)
        else:
            self.traits[hid] = traits
            env.update(message_fields(self.topology, hid, traits))
            env.update(contract_fields(at))
            wire = self._create_attributes(hop, at, traits, env)
        self._add(hid, env, at, faults, hop.from_agent, wire)
        return hid

    def _create_attributes(
        self, hop: Hop, at: int, traits: frozenset[str], env: dict[str, Any]
    ) -> dict[str, Any]:
        """The message kind and schema version (in `env`, with a version-2 sender's new
        fields) and the create's topology keywords: an in-process transfer's history report,
        a federated sender's Agent Card, a shared-queue producer's enqueue position."""
        version = 2 if self.rng.random() < self.cfg.rates.schema_rollout else 1
        env["message_kind"], env["schema_version"] = hop.kind, version
        if version == 2:
            env["extra"] = v2_fields(self.rng)
        kw: dict[str, Any] = {}
        if self.topology == "in_process" and hop.mode == "transfer":
            unfiltered = "unfiltered_sensitive_history" in traits
            kw["history"] = history_report(self.rng, unfiltered=unfiltered)
        elif self.topology == "federated_a2a":
            stale = "stale_agent_card" in traits
            kw["agent_card"] = card_ref(self.rng, self.tenant, hop.to_agent, at, stale=stale)
        elif self.topology == "shared_queue":
            kw["enqueued"] = enqueued(self.queue_name(env), at)
        return kw

    def queue_name(self, env: Mapping[str, Any]) -> str:
        """The shared queue of a handoff's consumer (its to_agent's inbox, per tenant)."""
        return f"{self.tenant}.{env['to_agent']}.inbox"

    def _add(
        self,
        hid: str,
        env: dict[str, Any],
        at: int,
        faults: frozenset[str],
        actor: str,
        wire: dict[str, Any],
    ) -> None:
        self.envelopes[hid] = env
        self.on_create[hid] = wire
        self.handoffs.append(PlannedHandoff(self.tenant, MappingProxyType(env), at, faults))
        self.steps.append(
            Step(hid, "create", at, actor, MappingProxyType(wire), replay=hid in self.replayed)
        )
        self.state[hid] = "created"

    def replay(self, hid: str, at: int) -> str:
        """A consumer replaying the stream from an older offset takes `hid`'s message again:
        a copy (new handoff id, the consumer's own dedup key) whose every transition carries
        `handoff.replay`."""
        self.n_attempts += 1
        new = f"{self.task_id}-h{self.n_attempts}-{self.rng.getrandbits(32):08x}"
        env = dict(self.envelopes[hid], handoff_id=new, attempt=1)
        env["idempotency_key"] = f"{self.task_id}:replay:{self.n_attempts}"
        env.pop("retry_of", None)
        self.traits[new] = frozenset()
        self.replayed.add(new)
        self._add(new, env, at, frozenset(), str(env["from_agent"]), dict(self.on_create[hid]))
        return new

    def resend(self, hid: str, at: int) -> str:
        """The sender sends `hid`'s message again as a new handoff without naming it (no
        retry_of): a new id, the same task, agents, objective, payload and grant, a new
        idempotency key when `hid` had one (none when it had none), attempt 1."""
        self.n_attempts += 1
        new = f"{self.task_id}-h{self.n_attempts}-{self.rng.getrandbits(32):08x}"
        env = dict(self.envelopes[hid], handoff_id=new, attempt=1)
        if env.get("idempotency_key"):
            env["idempotency_key"] = f"{self.task_id}:{env['to_agent']}:{self.n_attempts}"
        env.pop("retry_of", None)
        self.traits[new] = self.traits[hid]
        wire = dict(self.on_create[hid])
        if "enqueued" in wire:  # a new message: the queue's position now
            wire["enqueued"] = enqueued(self.queue_name(env), at)
        self._add(new, env, at, frozenset(), str(env["from_agent"]), wire)
        return new

    def created_at(self, hid: str) -> int:
        return next(s.at_ns for s in self.steps if s.handoff_id == hid and s.event == "create")

    def accept_at(self, hid: str, t: int) -> int:
        """When the receiver takes `hid` (sent at t): a lagging queue consumer minutes late,
        an ack_missing one after the message's ttl."""
        late = late_ack_ns(self.traits[hid], self.envelopes[hid], self.created_at(hid))
        if late is not None:
            return late
        if "consumer_lag" in self.traits[hid]:
            return t + lag_ns(self.rng)
        return t + self.ms(ACCEPT_MS[self.topology])

    def step(self, hid: str, event: str, at: int, actor: str, **attrs: Any) -> int:
        self.state[hid] = next_state(self.state[hid], event).value  # raises if the plan is illegal
        attrs.update(self._topology_keywords(hid, event, actor))
        self.steps.append(
            Step(hid, event, at, actor, MappingProxyType(attrs), replay=hid in self.replayed)
        )
        return at

    def _topology_keywords(self, hid: str, event: str, actor: str) -> dict[str, Any]:
        """The topology keywords of a transition: the consumer's compatibility window on
        accept / reject, its queue position on a shared-queue accept, the result items on
        an agent-as-tool result."""
        env = self.envelopes[hid]
        kw: dict[str, Any] = {}
        if event in ("accept", "reject"):
            kw.update(consumer_window(actor, env["schema_version"], env.get("extra", {})))
        if event == "accept" and self.topology == "shared_queue":
            lagging = "consumer_lag" in self.traits[hid]
            created = self.created_at(hid)
            kw["queue"] = queue_position(self.rng, self.queue_name(env), created, lagging=lagging)
        if event in _RESULT_EVENTS and self.topology == "agent_as_tool":
            if hid not in self.items:
                partial = bool(self.traits[hid] & {"partial_result", "partial_result_committed"})
                self.items[hid] = result_items(self.rng, partial=partial)
            kw["result_items"] = self.items[hid]
        return kw

    def evidence(self, hid: str, valid: bool, at: int) -> dict[str, Any]:
        """Evidence keyword attributes of a result at `at`: refs with their claim and the
        time each was valid, the tool calls used (handoffs/simulator/_budget.py), and the
        fields returned (handoffs/simulator/_evidence.py)."""
        n = 2 + self.rng.randrange(3) if valid else 1
        kinds = ("doc", "test", "log", "run", "url")[:n]
        seen = iso_s(at - 60 * S)
        refs = [
            EvidenceRef(f"{kind}:{hid[-8:]}-{i}", _CLAIMS[kind], seen)
            for i, kind in enumerate(kinds)
        ]
        env = self.envelopes[hid]
        calls = tool_calls(
            env.get("max_tool_calls"), hid, over="tool_budget_exceeded" in self.traits[hid]
        )
        return {
            "evidence_count": n,
            "evidence_valid": valid,
            "evidence_refs": refs,
            "tool_calls": calls,
            **result_contract(self.traits[hid], env, refs),
        }

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

    def relabel(self, hid: str, labels: set[str] | frozenset[str]) -> None:
        """Replace the fault labels of handoff `hid`."""
        for i, h in enumerate(self.handoffs):
            if h.handoff_id == hid:
                self.handoffs[i] = PlannedHandoff(
                    h.tenant, h.envelope, h.created_ns, frozenset(labels)
                )
                return

    def add_label(self, hid: str, label: str) -> None:
        """Add one fault label to handoff `hid`."""
        for h in self.handoffs:
            if h.handoff_id == hid:
                self.relabel(hid, h.faults | {label})
                return
