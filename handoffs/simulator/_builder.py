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

from collector.contract import next_state
from collector.envelope import EvidenceRef
from handoffs.simulator._catalog import AGENTS, DEADLINE_MS, Hop
from handoffs.simulator._model import PlannedHandoff, ScenarioConfig, Step

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
        seen = iso_s(at - 60 * S)
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
