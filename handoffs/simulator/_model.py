"""Records of the simulator: failure rates, scenario settings, planned steps and handoffs.

Everything here is a frozen dataclass validated in __post_init__; a bad value raises
SimulatorConfigError naming the field. Times are integer nanoseconds since the Unix epoch,
durations in the field name's unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "AUDIT_KINDS",
    "BUDGET_FAULTS",
    "CHAINED_KINDS",
    "CLI_AUDIT_RATE",
    "CLI_BUDGET_RATE",
    "CLI_EVIDENCE_RATE",
    "EVIDENCE_FAULTS",
    "FAULTS",
    "INFERRED_FAULTS",
    "FailureRates",
    "PlannedHandoff",
    "ScenarioConfig",
    "SimulatorConfigError",
    "SkillOutage",
    "Step",
    "TaskPlan",
]

#: Ground-truth labels the planner attaches to a handoff for each injected failure mode.
FAULTS: Final = (
    "bounce",  # wrong specialist picked: A->B transfer, B->A transfer back, then A->C
    "partial_result",  # specialist returns partial results: evidence_valid=False, committed
    "commit_fail",  # valid result prepared, then the commit fails (conflict): evidenced, not committed
    "duplicate_delivery",  # a write retried without dedup key: same transition delivered twice
    "stale_state_version",  # consumer lag: commit carries an older state_version
    "stale_fence",  # commit carries a fence token older than the lease's
    "idempotency_conflict",  # same idempotency key reused with a changed payload_hash
    "after_terminal",  # a message to a finished handoff (illegal transition, lenient shim)
    "skill_removed",  # rejected because the capability vanished from the Agent Card
    "timeout_resolved",  # timeout into unknown, later resolve_committed / resolve_failed
    "timeout_escalated",  # timeout into unknown, then escalated to a human
    "timeout_unresolved",  # timeout into unknown, never resolved
    "expire",  # nobody accepted before the deadline
    "cancel",  # the sender canceled
    "reject",  # the receiver refused (busy, policy)
    "fail",  # the receiver ran and failed
    # each topology's own failures (collector semconv's topology attributes show them)
    "unfiltered_sensitive_history",  # in-process transfer: the filter left sensitive items
    "partial_result_committed",  # agent-as-tool: fewer items than asked, evidence valid
    "fan_out_all",  # agent-as-tool: the orchestrator asked every expert in one task
    "consumer_lag",  # shared queue: the consumer is minutes and thousands of offsets behind
    "command_replayed",  # shared queue: a replayed command ran again (a side effect twice)
    "replay",  # shared queue: a replayed event ran again (harmless: no anomaly)
    "stale_agent_card",  # federated A2A: a days-old Agent Card; the skill is gone: rejected
    "card_skill_refused",  # federated A2A: a fresh card lists the skill; the agent refuses it
    "consumer_stalled",  # shared queue: the consumer stopped; the message is never taken
    "incompatible_accepted",  # schema rollout: the consumer left behind accepted version 2
    "risky_field_ignored",  # ... and ignored a risky field it did not know (amount_limit)
    # the evidence policy and reply contract every envelope declares (EVIDENCE_FAULTS)
    "evidence_out_of_window",  # a result cites a ref last valid before the policy's window
    "evidence_below_policy",  # a result cites a ref without the claim the policy requires
    "reply_contract_unmet",  # a committed result lacks a field the reply contract names
    "evidence_claim_disputed",  # ... either, with the evidence marked valid by the emitter
    # the envelope's promises (BUDGET_FAULTS; labels recomputed from the plan: _budget.py)
    "deadline_overrun",  # committed, failed or rejected after the envelope's deadline
    "tool_budget_exceeded",  # a result reports more tool calls than max_tool_calls
    "ack_missing",  # a message asking for an ack is accepted after its ttl_s (or never)
    # what senders do without declaring it: one label per flagged handoff (INFERRED_FAULTS;
    # a blind resend without retry_of is labelled blind_retry)
    "retry_after_final_refusal",  # a request refused with a final code is sent again
    "keyless_duplicate_write",  # a command or queue write without a key, applied twice
    "grant_caller_mismatch",  # the grant names another caller than the sender
    "missing_grant",  # capabilities asked for without any grant
    "out_of_order_version",  # the receiver's accept carries a state version older than seen
    # the protocol audit: one label per flagged handoff (see AUDIT_KINDS)
    "blind_retry",  # attempt B sent while attempt A was unknown (after a timeout)
    "duplicate_execution",  # B retried A under the same key after A committed; both commit
    "consumed_before_verified",  # the next hop consumes a receipt before it was read back
    "expired_receipt_used",  # the next hop consumes a receipt after its expiry
    "wrong_consumer",  # another agent than to_agent accepts, runs and commits
    "grant_expired",  # the grant expired before the receiver started
    "capability_outside_grant",  # the envelope asks for a capability the grant lacks
    "grant_tenant_mismatch",  # the grant names another tenant than the credential's
    "tenant_claim_mismatch",  # a span claims another tenant than the credential's
)

#: Protocol-audit kinds, each drawn per intent (at most one per intent) and named like the
#: anomaly kind that should flag the labelled handoff.
AUDIT_KINDS: Final = FAULTS[-9:]
#: Audit kinds whose labelled handoff is the NEXT hop of a task (a consumer of the previous
#: hop's receipt): they are drawn on hops with a predecessor only, at rate x n/(n-1) for an
#: n-hop task, so the rate stays a rate per intent; every workflow has >= 2 hops.
CHAINED_KINDS: Final = ("consumed_before_verified", "expired_receipt_used")
#: The rate per intent of every audit kind in the `simulate` and `demo` commands' defaults.
CLI_AUDIT_RATE: Final = 0.005
#: The envelope's promises broken, each a FailureRates overlay (handoffs/simulator/_budget.py)
BUDGET_FAULTS: Final = ("deadline_overrun", "tool_budget_exceeded", "ack_missing")
#: Their rate per intent in the `simulate` and `demo` commands' defaults.
CLI_BUDGET_RATE: Final = 0.01
#: The evidence checks broken, each a FailureRates overlay (handoffs/simulator/_evidence.py)
EVIDENCE_FAULTS: Final = ("evidence_out_of_window", "evidence_below_policy", "reply_contract_unmet")
#: Their rate per intent in the `simulate` and `demo` commands' defaults.
CLI_EVIDENCE_RATE: Final = 0.01
#: What senders do without declaring it, each a FailureRates field drawn per intent (at most
#: one per intent, on intents without an audit kind): `blind_resend` (a new id and key, no
#: retry_of, while the first attempt is unknown: labelled blind_retry) and the kinds of the
#: same names. Planned by handoffs/simulator/_inferred.py.
INFERRED_FAULTS: Final = (
    "blind_resend",
    "retry_after_final_refusal",
    "keyless_duplicate_write",
    "grant_caller_mismatch",
    "missing_grant",
    "out_of_order_version",
)


class SimulatorConfigError(ValueError):
    """A simulator setting is out of range; the message names the field."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {reason}")


@dataclass(frozen=True, slots=True)
class FailureRates:
    """Probabilities (0..1) per handoff intent of each injected failure mode.

    Outcome modes (reject, expire, cancel, fail, timeout, partial_result, commit_fail) are
    exclusive (commit_fail: a result with valid evidence is prepared, then the commit fails,
    the one path that lowers P_commit); their
    sum must be <= 1; the rest of the intents succeed. Overlay modes (bounce,
    duplicate_delivery, stale_state_version, stale_fence, idempotency_conflict,
    after_terminal) are drawn independently on top; the stale ones force a commit so the
    rate stays a rate per intent. A timeout resolves (resolve_committed or resolve_failed)
    with probability `timeout_resolve`, escalates with `timeout_escalate`, else stays unknown.

    Each topology's own faults (`TOPOLOGY_FAULTS`) are drawn on that topology's intents only,
    at their rate per intent OF THE TOPOLOGY: bounce and unfiltered_sensitive_history
    (in_process), partial_result and partial_result_committed (agent_as_tool; fan_out_all
    per agent_as_tool task), duplicate_delivery, consumer_lag and replay (shared_queue; a
    replayed command is labelled command_replayed) and consumer_stalled (shared_queue: the
    message is enqueued, never taken, and expires; an `expire` there is labelled so too), after_terminal, stale_agent_card and
    card_skill_refused (federated_a2a: the agent refuses a skill its freshly fetched card
    still lists; a skill outage there is one too). `schema_rollout` is the share of intents
    (any topology) whose sender already writes envelope schema version 2 (LEFT_BEHIND reads
    only version 1).
    The audit kinds (AUDIT_KINDS) and what senders do without declaring it (INFERRED_FAULTS)
    default to 0: each is at most one per intent, the inferred ones on intents without an
    audit kind (and not feeding a chained one).
    The envelope's promises (BUDGET_FAULTS: deadline_overrun, tool_budget_exceeded,
    ack_missing) are overlays drawn independently, default 0 (CLI_BUDGET_RATE in the CLI);
    they force a success (an ack_missing one: an accepted outcome). Ordinary traffic breaks
    them too (a timeout resolved after the deadline, a message that expired unacknowledged),
    so their labels are what each plan shows (handoffs/simulator/_budget.py).
    The evidence checks broken (EVIDENCE_FAULTS: evidence_out_of_window,
    evidence_below_policy, reply_contract_unmet) are overlays too, default 0 (CLI_EVIDENCE_RATE in the CLI); they
    need a result, so they force a success (handoffs/simulator/_evidence.py).
    """

    reject: float = 0.03
    expire: float = 0.02
    cancel: float = 0.02
    fail: float = 0.03
    timeout: float = 0.04
    partial_result: float = 0.15
    commit_fail: float = 0.02
    bounce: float = 0.15
    duplicate_delivery: float = 0.12
    stale_state_version: float = 0.01
    stale_fence: float = 0.01
    idempotency_conflict: float = 0.01
    after_terminal: float = 0.06
    unfiltered_sensitive_history: float = 0.15
    partial_result_committed: float = 0.06
    fan_out_all: float = 0.05
    consumer_lag: float = 0.08
    replay: float = 0.04
    stale_agent_card: float = 0.08
    card_skill_refused: float = 0.04
    consumer_stalled: float = 0.03
    schema_rollout: float = 0.3
    timeout_resolve: float = 0.6
    timeout_escalate: float = 0.2
    blind_retry: float = 0.0
    duplicate_execution: float = 0.0
    consumed_before_verified: float = 0.0
    expired_receipt_used: float = 0.0
    wrong_consumer: float = 0.0
    grant_expired: float = 0.0
    capability_outside_grant: float = 0.0
    grant_tenant_mismatch: float = 0.0
    tenant_claim_mismatch: float = 0.0
    blind_resend: float = 0.0
    retry_after_final_refusal: float = 0.0
    keyless_duplicate_write: float = 0.0
    grant_caller_mismatch: float = 0.0
    missing_grant: float = 0.0
    out_of_order_version: float = 0.0
    deadline_overrun: float = 0.0
    tool_budget_exceeded: float = 0.0
    ack_missing: float = 0.0
    evidence_out_of_window: float = 0.0
    evidence_below_policy: float = 0.0
    reply_contract_unmet: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise SimulatorConfigError(f.name, f"must be a number in [0, 1], got {v!r}")
            if not 0.0 <= float(v) <= 1.0:
                raise SimulatorConfigError(f.name, f"must be in [0, 1], got {v!r}")
        outcome = (
            self.reject
            + self.expire
            + self.cancel
            + self.fail
            + self.timeout
            + self.partial_result
            + self.commit_fail
        )
        if outcome > 1.0 + 1e-9:
            raise SimulatorConfigError(
                "reject+expire+cancel+fail+timeout+partial_result+commit_fail",
                f"exclusive outcome rates sum to {outcome:.3f} > 1",
            )
        if self.timeout_resolve + self.timeout_escalate > 1.0 + 1e-9:
            raise SimulatorConfigError("timeout_resolve+timeout_escalate", "sum must be <= 1")
        audit = sum(getattr(self, k) for k in AUDIT_KINDS)
        audit += sum(getattr(self, k) for k in CHAINED_KINDS)
        if audit > 1.0 + 1e-9:
            raise SimulatorConfigError(
                "+".join(AUDIT_KINDS) + " (chained kinds twice)",
                f"audit rates sum to {audit:.3f} > 1",
            )
        inferred = sum(getattr(self, k) for k in INFERRED_FAULTS)
        if inferred > 1.0 + 1e-9:
            raise SimulatorConfigError("+".join(INFERRED_FAULTS), f"sum to {inferred:.3f} > 1")

    @classmethod
    def cli_defaults(cls) -> FailureRates:
        """The defaults plus every audit and inferred kind at CLI_AUDIT_RATE (the CLI's
        starting point)."""
        return cls(
            **dict.fromkeys((*AUDIT_KINDS, *INFERRED_FAULTS), CLI_AUDIT_RATE),
            **dict.fromkeys(BUDGET_FAULTS, CLI_BUDGET_RATE),
            **dict.fromkeys(EVIDENCE_FAULTS, CLI_EVIDENCE_RATE),
        )

    @classmethod
    def none(cls) -> FailureRates:
        """No injected failures at all: every intent succeeds."""
        return cls(**{f.name: 0.0 for f in fields(cls)})

    @classmethod
    def parse(cls, spec: str, *, base: FailureRates | None = None) -> FailureRates:
        """Parse 'bounce=0.05,timeout=0.1' over `base` (default rates); unknown names refused."""
        known = {f.name for f in fields(cls)}
        values = {f.name: getattr(base or cls(), f.name) for f in fields(cls)}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, raw = part.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise SimulatorConfigError(
                    name or part, f"expected NAME=RATE with NAME in {', '.join(sorted(known))}"
                )
            try:
                values[name] = float(raw)
            except ValueError:
                raise SimulatorConfigError(name, f"rate must be a number, got {raw!r}") from None
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SkillOutage:
    """A skill removed from an Agent Card for a time slice: handoffs to `to_agent` asking for
    `capability` inside [start_ns, end_ns) are rejected with `unknown_capability` at
    `reject_rate` (a rejection spike for that target capability)."""

    to_agent: str
    capability: str
    start_ns: int
    end_ns: int
    reject_rate: float = 0.9

    def __post_init__(self) -> None:
        if not self.to_agent:
            raise SimulatorConfigError("outage.to_agent", "must not be empty")
        if not self.capability:
            raise SimulatorConfigError("outage.capability", "must not be empty")
        if self.end_ns <= self.start_ns:
            raise SimulatorConfigError("outage.end_ns", "must be after start_ns")
        if not 0.0 <= self.reject_rate <= 1.0:
            raise SimulatorConfigError(
                "outage.reject_rate", f"must be in [0, 1], got {self.reject_rate}"
            )

    @classmethod
    def from_spec(
        cls, spec: str, start_ns: int, end_ns: int, *, reject_rate: float = 0.9
    ) -> SkillOutage:
        """Parse 'AGENT:CAPABILITY@FROM-TO' (FROM, TO fractions of [start_ns, end_ns))."""
        try:
            who, _, window = spec.partition("@")
            agent, _, cap = who.partition(":")
            lo, _, hi = window.partition("-")
            a, b = float(lo), float(hi)
        except ValueError:
            raise SimulatorConfigError(
                "outage", f"expected AGENT:CAPABILITY@FROM-TO, got {spec!r}"
            ) from None
        if not (0 <= a < b <= 1):
            raise SimulatorConfigError(
                "outage", f"fractions must satisfy 0 <= FROM < TO <= 1, got {spec!r}"
            )
        span = end_ns - start_ns
        return cls(agent, cap, start_ns + int(span * a), start_ns + int(span * b), reject_rate)

    def covers(self, to_agent: str, capabilities: tuple[str, ...], at_ns: int) -> bool:
        return (
            to_agent == self.to_agent
            and self.capability in capabilities
            and self.start_ns <= at_ns < self.end_ns
        )


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    """What to simulate: tenants (name -> traffic weight), failure rates, time scale.

    `latency_scale` multiplies every planned latency (0.01 makes a live demo move fast).
    """

    seed: int = 7
    tenants: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({"acme": 0.5, "globex": 0.3, "initech": 0.2})
    )
    rates: FailureRates = field(default_factory=FailureRates)
    outage: SkillOutage | None = None
    latency_scale: float = 1.0
    id_prefix: str = ""  # mixed into task/handoff ids so two runs into one store never collide

    def __post_init__(self) -> None:
        if not self.tenants:
            raise SimulatorConfigError("tenants", "need at least one tenant")
        for name, w in self.tenants.items():
            if not name or not isinstance(name, str):
                raise SimulatorConfigError(
                    "tenants", f"tenant name must be a non-empty string, got {name!r}"
                )
            if not isinstance(w, int | float) or w <= 0:
                raise SimulatorConfigError("tenants", f"weight of {name!r} must be > 0, got {w!r}")
        if not isinstance(self.rates, FailureRates):
            raise SimulatorConfigError("rates", "must be a FailureRates")
        if not (0 < self.latency_scale <= 100):
            raise SimulatorConfigError(
                "latency_scale", f"must be in (0, 100], got {self.latency_scale}"
            )


@dataclass(frozen=True, slots=True)
class Step:
    """One planned shim call on one handoff.

    `event` is a contract event (`accept`, `commit`, ...) or `redeliver` (duplicate delivery
    of the previous transition). `illegal` marks a step a lenient tracer emits on purpose.
    `attrs` are the keyword attributes of Handoff.transition (evidence_count, fence_token,
    queue, result_items...); of a `create`, HandoffTracer.create's (history, agent_card).
    """

    handoff_id: str
    event: str
    at_ns: int
    actor: str
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    illegal: bool = False
    replay: bool = False  # emitted while replaying a stream (collector.replaying())


@dataclass(frozen=True, slots=True)
class PlannedHandoff:
    """One handoff attempt: its envelope (Envelope keyword arguments), tenant and faults."""

    tenant: str
    envelope: Mapping[str, Any]
    created_ns: int
    faults: frozenset[str] = frozenset()

    @property
    def handoff_id(self) -> str:
        return str(self.envelope["handoff_id"])


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """A business task: its handoffs and every step (creates included), sorted by time."""

    task_id: str
    tenant: str
    topology: str
    handoffs: tuple[PlannedHandoff, ...]
    steps: tuple[Step, ...]  # a `create` step per handoff plus its transitions, time-sorted
    intents: int  # business handoff intents (bounce / retry attempts add extra handoffs)
