"""Per anomaly kind, the seeded rows that make one handoff flagged with it: the table the
per-kind evidence test (test_evidence_findings.py) runs over analytics.ANOMALY_KINDS.

A kind without an entry here fails that test (it is not skipped): adding a kind means adding
its fixture. An entry is a `KindFixture`: the handoff the kind must flag, the rows (each
fixture in its own tenant, its agents named after it, so fixtures seeded together leave each
other alone; rejection_spike's groups span tenants, hence its own to_agent), and what its
package must name: `involves`, the other handoffs of a cross-handoff kind; `fleet`, whether a
fleet kind's group is named by reference; `settings`, the environment a kind needs (a policy
off by default). Times are seconds after T0; every fixture is judged over WINDOW (created in
[T0, T0 + 1 h), clock T0 + 2 h: all settled). VARIANTS are more fixtures of a kind (another
way it fires), seeded with the rest for the tests of their reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from analytics import Window
from collector import semconv as sc
from tests.analytics_seed import T, create

T0: Final = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW: Final = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))
EV: Final = {sc.EVIDENCE_COUNT: 1, sc.EVIDENCE_VALID: True}


@dataclass(frozen=True, slots=True)
class KindFixture:
    """The handoff `kind` must flag, its rows, and what its package must name besides."""

    handoff_id: str
    rows: tuple[T, ...]
    involves: tuple[str, ...] = ()
    fleet: bool = False
    tenant: str = ""
    #: the settings (environment variables) the kind needs, set while the report and the
    #: packages are built (a policy off by default: missing_grant's HANDOFFS_REQUIRE_GRANTS)
    settings: tuple[tuple[str, str], ...] = ()


def at(sec: float) -> datetime:
    return T0 + timedelta(seconds=sec)


class _Fx:
    """Row builders for one fixture: its tenant, its handoff ids prefixed with it."""

    def __init__(self, name: str) -> None:
        self.tenant = f"k-{name}"
        self.p = name.replace("_", "-")

    def h(self, n: int | str) -> str:
        return f"{self.p}-{n}"

    def create(self, n: int | str, sec: float, *, task: str = "", to: str = "worker",
               **attrs: Any) -> T:  # fmt: skip
        kw: dict[str, Any] = {"to_agent": to, "tenant": self.tenant}
        for k in ("mode", "from_agent", "topology", "capabilities", "idempotency_key",
                  "payload_hash", "deadline_ms"):  # fmt: skip
            if k in attrs:
                kw[k] = attrs.pop(k)
        return create(self.h(n), at(sec), task_id=task or f"t-{self.h(n)}", **kw, **attrs)

    def t(self, n: int | str, event: str, frm: str, to: str, sec: float, *,
          actor: str = "worker", **attrs: Any) -> T:  # fmt: skip
        return T(self.h(n), event, frm, to, at(sec), actor=actor, tenant=self.tenant,
                 attrs=attrs)  # fmt: skip

    def run(self, n: int | str, sec: float, *, by: str = "worker") -> list[T]:
        """accept at sec, start at sec + 1."""
        return [
            self.t(n, "accept", "created", "accepted", sec, actor=by),
            self.t(n, "start", "accepted", "running", sec + 1, actor=by),
        ]

    def commit(self, n: int | str, sec: float, **attrs: Any) -> T:
        return self.t(n, "commit", "running", "committed", sec, **{**EV, **attrs})

    def done(self, n: int | str, sec: float, **attrs: Any) -> list[T]:
        """create at sec, run, commit with valid evidence at sec + 3."""
        return [self.create(n, sec, **attrs), *self.run(n, sec + 1), self.commit(n, sec + 3)]

    def fixture(self, n: int | str, rows: list[T], *, involves: tuple[int | str, ...] = (),
                fleet: bool = False, settings: dict[str, str] | None = None) -> KindFixture:  # fmt: skip
        return KindFixture(self.h(n), tuple(rows), tuple(self.h(i) for i in involves), fleet,
                           self.tenant, tuple(sorted((settings or {}).items())))  # fmt: skip


def _iso(sec: float) -> str:
    return at(sec).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _grant(expires: float, caps: list[str], tenant: str) -> dict[str, Any]:
    return {sc.GRANT_CAPABILITIES: caps, sc.GRANT_TENANT: tenant, sc.GRANT_CALLER: "planner",
            sc.GRANT_SUBJECT: "user-1", sc.GRANT_EXPIRES_AT: _iso(expires)}  # fmt: skip


# ---------------------------------------------------------------- one handoff's own rows


def invalid_transition(f: _Fx) -> KindFixture:
    # two moves out of created: accepted and rejected
    return f.fixture(1, [f.create(1, 0), *f.run(1, 1)[:1],
                         f.t(1, "reject", "created", "rejected", 2)])  # fmt: skip


def duplicate_delivery(f: _Fx) -> KindFixture:
    accept = f.t(1, "accept", "created", "accepted", 1)
    again = T(accept.handoff_id, "accept", "created", "accepted", at(1.5), actor="worker",
              tenant=f.tenant, copy=1)  # fmt: skip
    return f.fixture(1, [f.create(1, 0), accept, again])


def committed_without_evidence(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.create(1, 0), *f.run(1, 1),
                         f.commit(1, 3, **{sc.EVIDENCE_VALID: False})])  # fmt: skip


def unknown_unresolved(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.create(1, 0), *f.run(1, 1),
                         f.t(1, "timeout", "running", "unknown", 3, actor="planner")])  # fmt: skip


def accepted_never_started(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.create(1, 0), f.t(1, "accept", "created", "accepted", 1)])


def clock_skew(f: _Fx) -> KindFixture:
    # the start is stamped before the accept it follows
    return f.fixture(1, [f.create(1, 0), f.t(1, "accept", "created", "accepted", 5),
                         f.t(1, "start", "accepted", "running", 2)])  # fmt: skip


def orphan_transition(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.t(1, "accept", "created", "accepted", 1)])


def implied_accept(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.create(1, 0), f.t(1, "start", "accepted", "running", 1)])


def wrong_consumer(f: _Fx) -> KindFixture:
    return f.fixture(1, [f.create(1, 0), *f.run(1, 1, by="intruder")])


def grant_expired(f: _Fx) -> KindFixture:
    g = _grant(2.5, ["search"], f.tenant)
    return f.fixture(1, f.done(1, 0, capabilities=["search"], **g))


def capability_outside_grant(f: _Fx) -> KindFixture:
    g = _grant(1000, ["search"], f.tenant)
    return f.fixture(1, f.done(1, 0, capabilities=["search", "deploy"], **g))


def grant_tenant_mismatch(f: _Fx) -> KindFixture:
    g = _grant(1000, ["search"], "globex")
    return f.fixture(1, f.done(1, 0, capabilities=["search"], **g))


def tenant_claim_mismatch(f: _Fx) -> KindFixture:
    return f.fixture(1, f.done(1, 0, **{sc.TENANT: "globex"}))


def consumer_lag(f: _Fx) -> KindFixture:
    lag: dict[str, Any] = {sc.QUEUE_LAG_MS: 90_000}
    return f.fixture(1, [f.create(1, 0), f.t(1, "accept", "created", "accepted", 1, **lag)])


def partial_result_committed(f: _Fx) -> KindFixture:
    part = {sc.RESULT_ITEMS_EXPECTED: 10, sc.RESULT_ITEMS_RETURNED: 3}
    return f.fixture(1, [f.create(1, 0), *f.run(1, 1), f.commit(1, 3, **part)])


def unfiltered_sensitive_history(f: _Fx) -> KindFixture:
    hist: dict[str, Any] = {sc.HISTORY_SENSITIVE_ITEMS: 3, sc.HISTORY_REMOVED_ITEMS: 1}
    return f.fixture(1, [f.create(1, 0, mode="transfer", **hist),
                         f.t(1, "accept", "created", "accepted", 1)])  # fmt: skip


def stale_agent_card(f: _Fx) -> KindFixture:
    # asks for a capability the card's skills lack
    card: dict[str, Any] = {sc.AGENT_CARD_SKILLS: ["search"], sc.AGENT_CARD_FETCHED_AT: _iso(-60)}
    return f.fixture(1, [f.create(1, 0, capabilities=["deploy"], **card),
                         f.t(1, "reject", "created", "rejected", 1,
                             **{sc.ERROR_CODE: "unknown_capability"})])  # fmt: skip


def command_replayed(f: _Fx) -> KindFixture:
    replay: dict[str, Any] = {sc.REPLAY: True}
    return f.fixture(1, [f.create(1, 0, **{sc.MESSAGE_KIND: "command"}),
                         f.t(1, "accept", "created", "accepted", 1),
                         f.t(1, "start", "accepted", "running", 2, **replay)])  # fmt: skip


def incompatible_accepted(f: _Fx) -> KindFixture:
    version: dict[str, Any] = {sc.SCHEMA_VERSION: 3}
    supported: dict[str, Any] = {sc.CONSUMER_SUPPORTED_VERSIONS: ["1", "2"]}
    return f.fixture(1, [f.create(1, 0, **version),
                         f.t(1, "accept", "created", "accepted", 1, **supported)])  # fmt: skip


def risky_field_ignored(f: _Fx) -> KindFixture:
    unknown: dict[str, Any] = {sc.ENVELOPE_UNKNOWN_FIELDS: ["grant.scope"]}
    return f.fixture(1, [f.create(1, 0),
                         f.t(1, "accept", "created", "accepted", 1, **unknown)])  # fmt: skip


def card_skill_refused(f: _Fx) -> KindFixture:
    # a fresh card listing the skill asked for, and the skill refused anyway
    card: dict[str, Any] = {sc.AGENT_CARD_SKILLS: ["search"], sc.AGENT_CARD_FETCHED_AT: _iso(-60)}
    return f.fixture(1, [f.create(1, 0, capabilities=["search"], **card),
                         f.t(1, "reject", "created", "rejected", 1,
                             **{sc.ERROR_CODE: "unknown_capability"})])  # fmt: skip


def grant_caller_mismatch(f: _Fx) -> KindFixture:
    # the grant was issued to another caller than the sender (from_agent planner)
    return f.fixture(1, f.done(1, 0, **{sc.GRANT_CALLER: "mallory"}))


def missing_grant(f: _Fx) -> KindFixture:
    # asks for a capability without any grant, where the policy requires one
    return f.fixture(1, f.done(1, 0, capabilities=["search"]),
                     settings={"HANDOFFS_REQUIRE_GRANTS": "1"})  # fmt: skip


def _declared(f: _Fx, result: dict[str, Any], **declared: Any) -> KindFixture:
    """One handoff declaring an evidence policy or reply contract, committed with `result`."""
    return f.fixture(1, [f.create(1, 0, **declared), *f.run(1, 1), f.commit(1, 3, **result)])


def evidence_out_of_window(f: _Fx) -> KindFixture:
    # its one ref was valid an hour before the policy's window opens
    return _declared(f, {sc.EVIDENCE_REFS: ["r1"], sc.EVIDENCE_VALID_AT: [_iso(-7200)]},
                     **{sc.EVIDENCE_POLICY_VALID_AFTER: _iso(-3600)})  # fmt: skip


def evidence_below_policy(f: _Fx) -> KindFixture:
    # one ref where the policy asks for two
    return _declared(f, {sc.EVIDENCE_REFS: ["r1"]}, **{sc.EVIDENCE_POLICY_MIN_REFS: 2})


def reply_contract_unmet(f: _Fx) -> KindFixture:
    # committed without the sources the contract's must_return names
    return _declared(f, {sc.EVIDENCE_REFS: ["r1"], sc.RESULT_FIELDS: ["answer"]},
                     **{sc.REPLY_CONTRACT_MUST_RETURN: ["answer", "sources"]})  # fmt: skip


def evidence_claim_disputed(f: _Fx) -> KindFixture:
    # marked valid (EV), while its ref carries no claim and the policy requires claims
    return _declared(f, {sc.EVIDENCE_REFS: ["r1"]},
                     **{sc.EVIDENCE_POLICY_REQUIRE_CLAIMS: True})  # fmt: skip


def deadline_overrun(f: _Fx) -> KindFixture:
    # committed 3 s after created, with a 1 s deadline
    return f.fixture(1, f.done(1, 0, deadline_ms=1000))


def tool_budget_exceeded(f: _Fx) -> KindFixture:
    budget: dict[str, Any] = {sc.MAX_TOOL_CALLS: 2}
    return f.fixture(1, [f.create(1, 0, **budget), *f.run(1, 1),
                         f.commit(1, 3, **{sc.TOOL_CALLS: 5})])  # fmt: skip


def ack_missing(f: _Fx) -> KindFixture:
    # an acknowledgement asked within 30 s; the accept came at 60 s
    ack: dict[str, Any] = {sc.MESSAGE_REQUIRES_ACK: True, sc.MESSAGE_TTL_S: 30}
    return f.fixture(1, [f.create(1, 0, **ack), f.t(1, "accept", "created", "accepted", 60)])


# ---------------------------------------------------------------- with other handoffs


def idempotency_conflict(f: _Fx) -> KindFixture:
    return f.fixture(2, [f.create(1, 0, idempotency_key="k", payload_hash="p1"),
                         f.create(2, 10, idempotency_key="k", payload_hash="p2")],
                     involves=(1,))  # fmt: skip


def stale_fence(f: _Fx) -> KindFixture:
    rows = [f.create(1, 0, task="tf"), *f.run(1, 1), f.commit(1, 5, **{sc.FENCE_TOKEN: 7}),
            f.create(2, 6, task="tf"), *f.run(2, 7), f.commit(2, 10, **{sc.FENCE_TOKEN: 3})]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def bounce(f: _Fx) -> KindFixture:
    return f.fixture(2, [f.create(1, 0, task="tb", mode="transfer", from_agent="planner", to="coder"),
                         f.create(2, 5, task="tb", mode="transfer", from_agent="coder", to="planner")],
                     involves=(1,))  # fmt: skip


def blind_retry(f: _Fx) -> KindFixture:
    key: dict[str, Any] = {"idempotency_key": "kr"}
    retry: dict[str, Any] = {sc.RETRY_OF: f.h(1), sc.ATTEMPT: 2}
    rows = [f.create(1, 0, task="tr", **key), *f.run(1, 1),
            f.t(1, "timeout", "running", "unknown", 3, actor="planner"),
            f.create(2, 10, task="tr", **key, **retry)]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def duplicate_execution(f: _Fx) -> KindFixture:
    key: dict[str, Any] = {"idempotency_key": "kc"}
    rows = [*f.done(1, 0, task="tc", **key), *f.done(2, 10, task="tc", **key)]
    return f.fixture(2, rows, involves=(1,))


def consumed_before_verified(f: _Fx) -> KindFixture:
    rows = [*f.done(1, 0), f.create(2, 10, **{sc.CAUSATION_ID: f.h(1)})]
    return f.fixture(2, rows, involves=(1,))


def expired_receipt_used(f: _Fx) -> KindFixture:
    rows = [f.create(1, 0), *f.run(1, 1),
            f.commit(1, 3, **{sc.RECEIPT_ID: "rcpt", sc.RECEIPT_EXPIRES_AT: _iso(100)}),
            f.t(1, "verify", "committed", "verified", 5, actor="planner"),
            f.create(2, 200, **{sc.CAUSATION_ID: f.h(1)})]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def fan_out_all(f: _Fx) -> KindFixture:
    tool = {"topology": "agent_as_tool", "from_agent": "orchestrator-k"}
    rows = [f.create(i, i, task="tfan", to=f"expert-{i}", **tool) for i in (1, 2, 3)]
    return f.fixture(1, rows, involves=(2, 3))


def retry_after_final_refusal(f: _Fx) -> KindFixture:
    retry: dict[str, Any] = {sc.RETRY_OF: f.h(1), sc.ATTEMPT: 2}
    rows = [f.create(1, 0, task="tq"),
            f.t(1, "reject", "created", "rejected", 1, **{sc.ERROR_CODE: "permission_denied"}),
            f.create(2, 10, task="tq", **retry)]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def keyless_duplicate_write(f: _Fx) -> KindFixture:
    # the same command, keyless, committed twice to one agent 10 s apart
    cmd = {"payload_hash": "pk", sc.MESSAGE_KIND: "command"}
    return f.fixture(2, [*f.done(1, 0, **cmd), *f.done(2, 10, **cmd)], involves=(1,))


def out_of_order_version(f: _Fx) -> KindFixture:
    # 2's accept carries state version 3 after 1's commit carried 5 in the task (on an
    # accept, not a commit: no stale_fence)
    older: dict[str, Any] = {sc.STATE_VERSION: 3}
    rows = [f.create(1, 0, task="tv"), *f.run(1, 1), f.commit(1, 3, **{sc.STATE_VERSION: 5}),
            f.create(2, 10, task="tv"),
            f.t(2, "accept", "created", "accepted", 11, **older)]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def consumer_stalled(f: _Fx) -> KindFixture:
    """1 enqueued at offset 1 of queue jobs, never taken; 2 enqueued after it at offset 2."""
    q: dict[str, Any] = {"topology": "shared_queue", "to": "stalled-k", sc.QUEUE_NAME: "jobs"}
    first: dict[str, Any] = {sc.QUEUE_OFFSET: 1}
    second: dict[str, Any] = {sc.QUEUE_OFFSET: 2}
    rows = [f.create(1, 0, **q, **first), f.create(2, 10, **q, **second)]
    return f.fixture(1, rows, involves=(2,))


# ---------------------------------------------------------------- the fleet


def rejection_spike(f: _Fx) -> KindFixture:
    """search-k/web: 1 of 10 rejected in the baseline (5 h before), 6 of 10 in the window."""
    rows: list[T] = []
    for prefix, start, rejected in (("b", -5 * 3600, 1), ("w", 0, 6)):
        for i in range(10):
            n, sec = f"{prefix}{i}", start + 60 * i
            rows.append(f.create(n, sec, to="spiker-k", capabilities=["web"]))
            if i < rejected:
                rows.append(f.t(n, "reject", "created", "rejected", sec + 1, actor="spiker-k"))
            else:
                rows += [f.t(n, "accept", "created", "accepted", sec + 1, actor="spiker-k"),
                         f.t(n, "cancel", "accepted", "canceled", sec + 2, actor="planner")]  # fmt: skip
    return f.fixture("w0", rows, fleet=True)


def sustained_rejections(f: _Fx) -> KindFixture:
    """sustainer-k/web: 3 of 5 rejected in each of two hours (the window's and the one before)."""
    rows: list[T] = []
    for prefix, start in (("b", -3600), ("w", 0)):
        for i in range(5):
            n, sec = f"{prefix}{i}", start + 60 * i
            rows.append(f.create(n, sec, to="sustainer-k", capabilities=["web"]))
            if i < 3:
                rows.append(f.t(n, "reject", "created", "rejected", sec + 1, actor="sustainer-k"))
            else:
                rows += [f.t(n, "accept", "created", "accepted", sec + 1, actor="sustainer-k"),
                         f.t(n, "cancel", "accepted", "canceled", sec + 2, actor="planner")]  # fmt: skip
    return f.fixture("w0", rows, fleet=True)


#: kind -> builder of its fixture. THE EXTENSION POINT: a kind of ANOMALY_KINDS missing here
#: fails test_evidence_findings.py; add its builder (rows making one handoff flagged with it).
BUILDERS: Final[dict[str, Callable[[_Fx], KindFixture]]] = {
    f.__name__: f
    for f in (
        invalid_transition,
        duplicate_delivery,
        idempotency_conflict,
        stale_fence,
        committed_without_evidence,
        unknown_unresolved,
        accepted_never_started,
        bounce,
        rejection_spike,
        clock_skew,
        orphan_transition,
        implied_accept,
        blind_retry,
        duplicate_execution,
        consumed_before_verified,
        expired_receipt_used,
        wrong_consumer,
        grant_expired,
        capability_outside_grant,
        grant_tenant_mismatch,
        tenant_claim_mismatch,
        consumer_lag,
        partial_result_committed,
        unfiltered_sensitive_history,
        stale_agent_card,
        command_replayed,
        incompatible_accepted,
        risky_field_ignored,
        fan_out_all,
        evidence_out_of_window,
        evidence_below_policy,
        reply_contract_unmet,
        evidence_claim_disputed,
        retry_after_final_refusal,
        keyless_duplicate_write,
        grant_caller_mismatch,
        missing_grant,
        out_of_order_version,
        deadline_overrun,
        tool_budget_exceeded,
        ack_missing,
        sustained_rejections,
        card_skill_refused,
        consumer_stalled,
    )
}


def fixtures() -> dict[str, KindFixture]:
    """kind -> its fixture, for every kind BUILDERS has."""
    return {kind: build(_Fx(kind)) for kind, build in BUILDERS.items()}


# ---------------------------------------------------------------- another way a kind fires


def blind_retry_inferred(f: _Fx) -> KindFixture:
    # no retry_of, no key: the same task, agents and objective while 1 is unknown
    obj = {sc.OBJECTIVE_HASH: "obj-r"}
    rows = [f.create(1, 0, task="ti", **obj), *f.run(1, 1),
            f.t(1, "timeout", "running", "unknown", 3, actor="planner"),
            f.create(2, 10, task="ti", **obj)]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


def retry_after_final_refusal_inferred(f: _Fx) -> KindFixture:
    # no retry_of: the same task, agents and objective after 1 was refused for good
    obj = {sc.OBJECTIVE_HASH: "obj-q"}
    rows = [f.create(1, 0, task="tj", **obj),
            f.t(1, "reject", "created", "rejected", 1, **{sc.ERROR_CODE: "permission_denied"}),
            f.create(2, 10, task="tj", **obj)]  # fmt: skip
    return f.fixture(2, rows, involves=(1,))


#: variant name -> (the kind it makes fire, its builder): seeded with BUILDERS' fixtures
VARIANTS: Final[dict[str, tuple[str, Callable[[_Fx], KindFixture]]]] = {
    "blind_retry_inferred": ("blind_retry", blind_retry_inferred),
    "retry_after_final_refusal_inferred": (
        "retry_after_final_refusal",
        retry_after_final_refusal_inferred,
    ),
}


def variants() -> dict[str, tuple[str, KindFixture]]:
    """variant name -> (its kind, its fixture)."""
    return {name: (kind, build(_Fx(name))) for name, (kind, build) in VARIANTS.items()}
