"""Every anomaly kind that flags one handoff, as an evidence package lists it (pure), and the
SQL that asks the anomaly passes about that one handoff.

A package's `findings` hold one entry per kind of analytics.ANOMALY_KINDS that
flags the handoff, in report order:

  kind      the kind
  source    "rows": rebuilt from the package's own transitions (ROW_KINDS: the handoff's
            own anomalies and the protocol-audit kinds its rows show), so verify rebuilds it
            offline; "store": what the store says of the handoff (analytics.evidence._evaluate:
            the task's and the related attempts' rows, or the anomaly passes themselves),
            asked over `findings_query`'s window; verify re-derives it against a store only
  scope     "handoff" (its own rows), "cross" (with other handoffs: `handoffs` names them),
            "fleet" (a population's verdict that covered it: `fleet` says which to_agent,
            capability and time range, by reference, not a copy), or "unclassified" (a kind
            SCOPES does not list yet: shown, nothing else named)
  handoffs  the other handoffs involved (sorted), for a cross kind
  fleet     the fleet groups, for a fleet kind: {to_agent, capability, start, end}

The store's kinds are every kind in the pass registry (analytics._sql.anomalies.KIND_PASS) but
the row kinds (row_kinds()), so a kind added to a pass is asked with no change here: a kind no fast
evaluator covers is asked of its pass as `handoffs anomalies` runs it (all tenants, the
report's SQL: pass_findings_sql), over a created-time window around the handoff
(subject_window) and kept to its (tenant, handoff_id). So the kinds a report flags it with
are the kinds its package lists (a window-dependent kind, fan_out_all, is judged over the
created times of its task within an hour of its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from analytics.oracle.audit import is_create

__all__ = [
    "FLEET_SPAN_NS",
    "ROW_KINDS",
    "SCOPES",
    "SOURCES",
    "TASK_REACH_NS",
    "Finding",
    "FleetRef",
    "findings_list",
    "pass_findings_sql",
    "row_findings",
    "row_kinds",
    "scope_of",
    "store_kinds",
    "subject_window",
]

#: kind -> scope ("handoff", "cross", "fleet"); a kind not here is "unclassified". A new
#: cross or fleet kind also wants its resolver (analytics.evidence._why_store.RESOLVERS) to name the
#: other handoffs or the fleet group.
SCOPES: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "invalid_transition",
            "duplicate_delivery",
            "committed_without_evidence",
            "unknown_unresolved",
            "accepted_never_started",
            "clock_skew",
            "orphan_transition",
            "implied_accept",
            "wrong_consumer",
            "grant_expired",
            "capability_outside_grant",
            "grant_tenant_mismatch",
            "tenant_claim_mismatch",
            "consumer_lag",
            "partial_result_committed",
            "unfiltered_sensitive_history",
            "stale_agent_card",
            "command_replayed",
            "incompatible_accepted",
            "risky_field_ignored",
            "card_skill_refused",
            "evidence_out_of_window",
            "evidence_below_policy",
            "reply_contract_unmet",
            "evidence_claim_disputed",
            "deadline_overrun",
            "tool_budget_exceeded",
            "ack_missing",
            "grant_caller_mismatch",
            "missing_grant",
        ),
        "handoff",
    ),
    **dict.fromkeys(
        (
            "idempotency_conflict",
            "stale_fence",
            "bounce",
            "blind_retry",
            "duplicate_execution",
            "consumed_before_verified",
            "expired_receipt_used",
            "fan_out_all",
            "retry_after_final_refusal",
            "out_of_order_version",
            # the earlier keyless write(s) of the same payload to the same agent
            "keyless_duplicate_write",
            # the later messages of the queue whose offsets show its head moved past it
            "consumer_stalled",
        ),
        "cross",
    ),
    **dict.fromkeys(("rejection_spike", "sustained_rejections"), "fleet"),
}
#: the kinds a package computes from its own rows (analytics.oracle.funnel.handoff_anomalies and
#: the protocol-audit kinds oracle.audit finds in one handoff's rows): source "rows"
ROW_KINDS: Final = frozenset(
    {
        "invalid_transition",
        "duplicate_delivery",
        "committed_without_evidence",
        "unknown_unresolved",
        "accepted_never_started",
        "clock_skew",
        "orphan_transition",
        "implied_accept",
        "wrong_consumer",
        "grant_expired",
        "capability_outside_grant",
        "grant_tenant_mismatch",
        "tenant_claim_mismatch",
    }
)
SOURCES: Final = ("rows", "store")


def row_kinds() -> frozenset[str]:
    """The kinds not asked of the store: ROW_KINDS and every kind analytics.evidence._why explains
    from a handoff's own rows (a kind registered there is one the package computes from
    them, as the evidence checks of analytics.oracle.funnel.handoff_anomalies)."""
    from analytics.evidence._why import ROW_KINDS as EXPLAINED

    return ROW_KINDS | EXPLAINED


#: how far from the handoff's own created time the window reaches for its task's other
#: handoffs (ns): one hour
TASK_REACH_NS: Final = 3600 * 1_000_000_000
#: the time range a fleet reference names when its resolver knows no better: one hour (ns)
FLEET_SPAN_NS: Final = 3600 * 1_000_000_000
_US: Final = 1000


def scope_of(kind: str) -> str:
    """The kind's scope (SCOPES), "unclassified" for a kind it does not list."""
    return SCOPES.get(kind, "unclassified")


@dataclass(frozen=True, slots=True)
class FleetRef:
    """A fleet group by reference: the to_agent and capability ("" when the envelope named
    none) judged over [start, end) (ISO-8601 UTC with nanoseconds)."""

    to_agent: str
    capability: str
    start: str
    end: str

    def as_dict(self) -> dict[str, str]:
        return {
            "to_agent": self.to_agent,
            "capability": self.capability,
            "start": self.start,
            "end": self.end,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """One kind flagging the handoff (see the module doc for each field)."""

    kind: str
    source: str
    handoffs: tuple[str, ...] = ()
    fleet: tuple[FleetRef, ...] = ()
    scope: str = field(default="")

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"finding source must be one of {SOURCES}, got {self.source!r}")
        if not self.scope:
            object.__setattr__(self, "scope", scope_of(self.kind))

    def as_dict(self) -> dict[str, Any]:
        """The package's finding object."""
        return {
            "kind": self.kind,
            "scope": self.scope,
            "source": self.source,
            "handoffs": sorted(set(self.handoffs)),
            "fleet": [f.as_dict() for f in sorted(set(self.fleet), key=_fleet_key)],
        }


def _fleet_key(f: FleetRef) -> tuple[str, str, str, str]:
    return (f.start, f.to_agent, f.capability, f.end)


def _report_order() -> tuple[str, ...]:
    from analytics.anomaly_kinds import ANOMALY_KINDS  # pandas: loaded when a package is built

    return tuple(ANOMALY_KINDS)


def store_kinds(row_kinds: Iterable[str]) -> tuple[str, ...]:
    """The kinds asked of the store: every kind of the pass registry but `row_kinds`, in
    report order (a kind a pass returns that the report does not list comes last)."""
    from analytics._sql.anomalies import KIND_PASS

    skip = set(row_kinds)
    order = [k for k in _report_order() if k in KIND_PASS]
    order += sorted(set(KIND_PASS) - set(order))
    return tuple(k for k in order if k not in skip)


def row_findings(kinds: Iterable[str]) -> list[Finding]:
    """The findings of the kinds rebuilt from the handoff's own rows."""
    return [Finding(k, "rows") for k in kinds]


def findings_list(findings: Iterable[Finding | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The package's `findings`: one object per kind (the first given wins), in report order,
    then any other kind by name."""
    by: dict[str, dict[str, Any]] = {}
    for f in findings:
        d = f.as_dict() if isinstance(f, Finding) else _checked(f)
        by.setdefault(str(d["kind"]), d)
    rank = {k: i for i, k in enumerate(_report_order())}
    return [by[k] for k in sorted(by, key=lambda k: (rank.get(k, len(rank)), k))]


def _checked(d: Mapping[str, Any]) -> dict[str, Any]:
    """A finding object as given (a package's own), with its fields' types checked."""
    if not isinstance(d, Mapping) or not isinstance(d.get("kind"), str):
        raise ValueError(f"finding must be an object with a string 'kind', got {d!r}")
    out = dict(d)
    for name in ("handoffs", "fleet"):
        if not isinstance(out.get(name, []), list):
            raise ValueError(f"finding {d['kind']!r}: {name} must be a list")
    return out


def subject_window(
    rows: Sequence[Mapping[str, Any]], task_rows: Sequence[Mapping[str, Any]] = ()
) -> tuple[int, int]:
    """[start, end) in ns (whole microseconds: a Window holds datetimes) of the created-time
    window the store's kinds are asked over: the handoff's created time (its earliest
    create; its earliest row when it has none, as the orphan pass reads first_seen) and the
    created times of its task's other handoffs (`task_rows`) within TASK_REACH_NS of it.
    ValueError when rows is empty."""
    if not rows:
        raise ValueError("no transitions: no window to ask the anomaly passes over")
    own = [int(r["time_ns"]) for r in rows if is_create(r)]
    t0 = min(own) if own else min(int(r["time_ns"]) for r in rows)
    created: dict[str, int] = {}
    for r in task_rows:
        if is_create(r):
            h, t = str(r["handoff_id"]), int(r["time_ns"])
            created[h] = min(created.get(h, t), t)
    near = [t for t in created.values() if abs(t - t0) <= TASK_REACH_NS]
    lo, hi = min([t0, *near]), max([t0, *near])
    return lo - lo % _US, hi - hi % _US + _US


def pass_findings_sql(name: str, db: str, window: Any, kinds: Sequence[str]) -> str:
    """SQL of the kinds among `kinds` that pass `name` flags the handoff `{handoff:String}`
    of tenant `{handoff_tenant:String}` with (one row per kind, column `kind`): the pass
    built as the report builds it for `window` over all tenants, kept to that handoff.
    ValueError for an unknown pass or a kind it does not return."""
    from analytics._sql.anomalies import PASSES, pass_sql
    from analytics.oracle.funnel import UNKNOWN_SLA_MS

    if name not in PASSES:
        raise ValueError(f"unknown anomaly pass {name!r}")
    foreign = [k for k in kinds if k not in PASSES[name]]
    if foreign or not kinds:
        raise ValueError(f"pass {name!r} returns {list(PASSES[name])}, not {foreign or kinds}")
    inner = pass_sql(name, db, window, tenant=False, sla_ms=UNKNOWN_SLA_MS)
    flags = ", ".join(f"if(coalesce({k}, false), '{k}', '')" for k in kinds)
    return f"""SELECT DISTINCT kind FROM (
    SELECT arrayJoin(arrayFilter(k -> k != '', [{flags}])) AS kind FROM ({inner})
    WHERE tenant = {{handoff_tenant:String}} AND handoff_id = {{handoff:String}})"""
