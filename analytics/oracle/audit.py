"""The protocol-audit kinds in plain Python over transition rows: the oracle the SQL of the
retry, causation and state passes (analytics/_sql/anomalies.py) is tested against, and part
of evidence packages. Rows as in analytics.oracle.funnel; definitions: docs/metrics.md.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from analytics.oracle.funnel import Row, counted
from analytics.oracle.inferred import inferred_link, request
from collector import semconv

__all__ = ["AUDIT_KINDS", "attrs", "audit_anomalies", "is_create", "iso_ns"]


#: the protocol-audit kinds audit_anomalies computes (docs/metrics.md)
AUDIT_KINDS: Final = (
    "blind_retry",
    "duplicate_execution",
    "consumed_before_verified",
    "expired_receipt_used",
    "wrong_consumer",
    "grant_expired",
    "capability_outside_grant",
    "grant_tenant_mismatch",
    "tenant_claim_mismatch",
)
_RECEIVER_EVENTS: Final = frozenset({"accept", "reject", "start", "prepare", "commit", "fail"})
_GRANT_USE_EVENTS: Final = frozenset({"start", "prepare", "commit"})
_RECEIPT_EVENTS: Final = frozenset({"commit", "resolve_committed"})


def iso_ns(text: str | None) -> int | None:
    """An ISO-8601 time (`Z` or an offset; naive = UTC) as ns since the epoch; None when
    empty or not a time."""
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    d = t - datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def attrs(r: Row) -> Mapping[str, str]:
    """A row's attribute map as stored (string[] values as JSON text); {} when absent."""
    return r.get("attributes") or {}


def is_create(r: Row) -> bool:
    """A counted-shape create row (valid, `create`, none -> created): an envelope row."""
    return (
        bool(r.get("valid", True))
        and r["event"] == "create"
        and not r["from_state"]
        and r["to_state"] == "created"
    )


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What the cross-handoff kinds read of one handoff (times in ns, None when unseen):
    envelope values are the greatest over its counted create rows; first counted entry
    into / exit out of unknown, first counted entry into committed."""

    task_id: str
    to_agent: str
    idem: str
    created: int | None
    t_in: int | None
    t_out: int | None
    t_commit: int | None
    retry_of: str | None
    cause: str | None
    t_verified: int | None
    receipt_expiry: int | None


def _attempt(rows: Sequence[Row]) -> _Attempt:
    c = [r for r in rows if counted(r)]
    cr = [r for r in rows if is_create(r)]

    def first(cond: Callable[[Row], bool]) -> int | None:
        return min((int(r["time_ns"]) for r in c if cond(r)), default=None)

    def create_attr(name: str) -> str | None:
        vals = [attrs(r)[name] for r in cr if name in attrs(r)]
        return max(vals) if vals else None

    expiries = [
        iso_ns(attrs(r).get(semconv.RECEIPT_EXPIRES_AT))
        for r in rows
        if bool(r.get("valid", True)) and r["event"] in _RECEIPT_EVENTS
    ]
    verify = [
        int(r["time_ns"])
        for r in rows
        if bool(r.get("valid", True))
        and (r["from_state"], r["event"], r["to_state"]) == ("committed", "verify", "verified")
    ]
    return _Attempt(
        task_id=max((str(r.get("task_id") or "") for r in rows), default=""),
        to_agent=max((str(r.get("to_agent") or "") for r in cr), default=""),
        idem=max((str(r.get("idempotency_key") or "") for r in cr), default=""),
        created=min((int(r["time_ns"]) for r in cr), default=None),
        t_in=first(lambda r: r["to_state"] == "unknown"),
        t_out=first(lambda r: r["from_state"] == "unknown"),
        t_commit=first(lambda r: r["to_state"] == "committed"),
        retry_of=create_attr(semconv.RETRY_OF),
        cause=create_attr(semconv.CAUSATION_ID),
        t_verified=min(verify, default=None),
        receipt_expiry=min((e for e in expiries if e is not None), default=None),
    )


def _blind(a: _Attempt, b: _Attempt) -> bool:
    assert b.created is not None
    return a.t_in is not None and a.t_in < b.created and (a.t_out is None or a.t_out > b.created)


def _own_kinds(tenant: str, rows: Sequence[Row]) -> set[str]:
    kinds: set[str] = set()
    cr = [r for r in rows if is_create(r)]
    to_agent = max((str(r.get("to_agent") or "") for r in cr), default="")
    if to_agent and any(
        r["event"] in _RECEIVER_EVENTS and str(r.get("actor") or "") != to_agent for r in rows
    ):
        kinds.add("wrong_consumer")
    exp = iso_ns(max((attrs(r).get(semconv.GRANT_EXPIRES_AT, "") for r in cr), default=""))
    uses = [int(r["time_ns"]) for r in rows if r["event"] in _GRANT_USE_EVENTS]
    if exp is not None and uses and max(uses) > exp:
        kinds.add("grant_expired")
    grants = [
        attrs(r)[semconv.GRANT_CAPABILITIES] for r in cr if semconv.GRANT_CAPABILITIES in attrs(r)
    ]
    if grants:
        try:
            allowed = json.loads(max(grants))
        except ValueError:
            allowed = []
        allowed = allowed if isinstance(allowed, list) else []
        caps = max((list(r.get("capabilities") or ()) for r in cr), default=[])
        if not set(caps) <= {str(x) for x in allowed}:
            kinds.add("capability_outside_grant")
    g_tenant = max((attrs(r).get(semconv.GRANT_TENANT, "") for r in cr), default="")
    if g_tenant and g_tenant != tenant:
        kinds.add("grant_tenant_mismatch")
    if any((r.get("claimed_tenant") or "") not in ("", tenant) for r in rows):
        kinds.add("tenant_claim_mismatch")
    return kinds


def audit_anomalies(rows: Iterable[Row]) -> dict[tuple[str, str], list[str]]:
    """The protocol-audit kinds (AUDIT_KINDS) of every handoff with a counted create, from
    all stored rows (any tenants): {(tenant, handoff_id): sorted kinds}, handoffs without one
    left out. Rows need the handoff_transitions columns tenant, task_id, actor, from_agent,
    to_agent, idempotency_key, capabilities, claimed_tenant, attributes (the map as stored:
    string[] as JSON text) besides the ones facts() reads. blind_retry also pairs attempts
    linked by inference (analytics.oracle.inferred.inferred_link). Definitions:
    docs/metrics.md."""
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), r["handoff_id"])].append(r)
    att = {k: _attempt(v) for k, v in by_h.items()}
    # a retry the sender did not link: same task, agents and objective (oracle.inferred)
    req = {k: request(k[0], k[1], v) for k, v in by_h.items()}
    out: dict[tuple[str, str], list[str]] = {}
    for (tenant, h), b in att.items():
        if b.created is None:
            continue
        kinds = _own_kinds(tenant, by_h[(tenant, h)])
        for (t2, h2), a in att.items():
            if t2 != tenant or h2 == h:
                continue
            same_slot = bool(b.idem) and (a.task_id, a.to_agent, a.idem) == (
                b.task_id,
                b.to_agent,
                b.idem,
            )
            inferred = inferred_link(req[(t2, h2)], req[(tenant, h)])
            if (b.retry_of == h2 or same_slot or inferred) and _blind(a, b):
                kinds.add("blind_retry")
            if (
                b.idem
                and a.idem == b.idem
                and a.t_commit is not None
                and b.t_commit is not None
                and (a.t_commit, h2) < (b.t_commit, h)
            ):
                kinds.add("duplicate_execution")
            if b.cause == h2:
                if a.t_verified is None or b.created < a.t_verified:
                    kinds.add("consumed_before_verified")
                if a.receipt_expiry is not None and b.created > a.receipt_expiry:
                    kinds.add("expired_receipt_used")
        out[(tenant, h)] = sorted(kinds)
    return out
