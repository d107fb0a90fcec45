"""What else a cross-handoff or fleet finding involves, and why it fired: the resolvers an
evidence package runs for the kinds the anomaly passes flag it with (analytics.evidence._findings).

RESOLVERS maps a kind to a function of the handoff's Neighbourhood (analytics.evidence._evaluate:
its rows, its task's rows, the window asked, the store) returning a `Resolved`:
the other handoffs involved (cross kinds: the attempt retried, the other holder of the
idempotency key, the bounce partner, the upstream handoff, the task's other expert calls,
the earlier write of the same payload, the task's higher version, the later messages of a
stalled queue), the fleet groups by reference (fleet kinds: which to_agent, capability and
hours), and the Reason sentence (analytics.evidence._why.Reason; the topology, budget, inferred and
queue kinds' in analytics.evidence._why_topology, _why_budget, _why_inferred and _why_queue). Each
reads by primary key, or one small aggregate;
a kind without a resolver gets none (a fleet kind: the hour of its creation per to_agent and
capability, `default_fleet`). The sentences follow the passes' definitions
(docs/metrics.md); a resolver explains a verdict, it never makes one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.rows import POINT_LOOKUP, fetch_rows
from analytics.evidence import (
    _why_budget,
    _why_fleet,
    _why_inferred,
    _why_queue,
    _why_task,
    _why_topology,
)
from analytics.evidence._findings import FleetRef
from analytics.evidence._why import Reason, _step, _when
from analytics.oracle.audit import iso_ns as parse_time
from analytics.oracle.inferred import INFERRED_REASON
from collector import semconv as sc

if TYPE_CHECKING:
    from analytics.evidence._evaluate import Neighbourhood

__all__ = ["RESOLVERS", "Resolved", "default_fleet"]

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Resolved:
    """Other handoffs involved, fleet groups, and the reason (None: the default sentence)."""

    handoffs: tuple[str, ...] = ()
    fleet: tuple[FleetRef, ...] = ()
    reason: Reason | None = None


Resolver = Callable[["Neighbourhood"], Resolved]


def _others(n: Neighbourhood, ids: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({str(h) for h in ids if h and str(h) != n.handoff_id}))


def _from_reason(n: Neighbourhood, reason: Reason | None) -> Resolved:
    return Resolved(_others(n, [reason.other_handoff_id] if reason else []), (), reason)


# ---------------------------------------------------------------- the task's rows


def _stale_fence(n: Neighbourhood) -> Resolved:
    return _from_reason(n, _why_task.stale_fence(n.task_rows, n.handoff_id))


def _bounce(n: Neighbourhood) -> Resolved:
    return _from_reason(n, _why_task.bounce(n.task_rows, n.handoff_id))


def _idempotency(n: Neighbourhood) -> Resolved:
    """Every other handoff whose create holds the key with another payload hash; the reason
    names the earliest (_why_task.idempotency_conflict)."""
    own = next((r for r in sorted(n.rows, key=lambda r: int(r["time_ns"]))
                if r["event"] == "create" and r.get("idempotency_key")), None)  # fmt: skip
    if own is None:
        return Resolved()
    mine = str(own.get("payload_hash") or "")
    res = n.client.query(
        f"""SELECT handoff_id, payload_hash, toUnixTimestamp64Nano(min(time)) AS t
        FROM {n.db}.handoff_transitions
        WHERE tenant = {{t:String}} AND event = 'create' AND idempotency_key = {{k:String}}
          AND payload_hash != '' AND payload_hash != {{p:String}}
        GROUP BY handoff_id, payload_hash ORDER BY t, handoff_id""",
        parameters={"t": n.tenant, "k": own["idempotency_key"], "p": mine},
        settings=POINT_LOOKUP,
    ).result_rows
    other = (
        {"handoff_id": str(res[0][0]), "payload_hash": str(res[0][1]), "time_ns": int(res[0][2])}
        if res
        else None
    )
    return Resolved(
        _others(n, [h for h, _p, _t in res]), (), _why_task.idempotency_conflict(own, other)
    )


# ---------------------------------------------------------------- attempts of one slot


@dataclass(frozen=True, slots=True)
class _Attempt:
    handoff_id: str
    task_id: str
    to_agent: str
    idem: str
    created: int | None
    t_in: int | None
    t_out: int | None
    t_commit: int | None


def _attempts(n: Neighbourhood, also: Sequence[str] = ()) -> dict[str, _Attempt]:
    """The summary (merged) of the handoff, the one its retry_of names, every handoff of
    the tenant holding its idempotency key, and `also`, as the retry pass reads them."""
    ids = [n.handoff_id, n.envelope("", sc.RETRY_OF), *also]
    key = n.envelope("idempotency_key")
    res = n.client.query(
        f"""SELECT handoff_id, max(task_id), max(to_agent), max(idempotency_key),
            toUnixTimestamp64Nano(min(created)), toUnixTimestamp64Nano(min(t_unknown_in)),
            toUnixTimestamp64Nano(min(t_unknown_out)), toUnixTimestamp64Nano(min(t_committed))
        FROM {n.db}.handoff_summary
        WHERE tenant = {{t:String}} AND (handoff_id IN {{ids:Array(String)}}
            OR (idempotency_key != '' AND idempotency_key = {{k:String}}))
        GROUP BY handoff_id""",
        parameters={"t": n.tenant, "ids": [i for i in ids if i], "k": key},
    ).result_rows

    def ns(v: Any) -> int | None:
        return None if v is None else int(v)

    return {
        str(h): _Attempt(str(h), str(t), str(a), str(k), ns(cr), ns(i), ns(o), ns(cm))
        for h, t, a, k, cr, i, o, cm in res
    }


def _blind_retry(n: Neighbourhood) -> Resolved:
    """The earlier attempts (named by retry_of, of the same task, to_agent and key, or
    linked by inference: the same task, agents and objective, no retry_of) that were unknown
    when this one was created."""
    retry_of = n.envelope("", sc.RETRY_OF)
    # linked by inference only (oracle.inferred.retry_links), read from its task's rows
    inferred = (
        {h for h, link in _why_inferred.inferred_links(n, "blind_retry").items() if link == "inferred"}
        if not retry_of
        else set()
    )  # fmt: skip
    att = _attempts(n, sorted(inferred))
    b = att.get(n.handoff_id)
    if b is None or b.created is None:
        return Resolved()
    found: list[tuple[int, _Attempt]] = []  # (0 named by retry_of, 1 same slot, 2 inferred)
    for a in att.values():
        slot = bool(b.idem) and (a.task_id, a.to_agent, a.idem) == (b.task_id, b.to_agent, b.idem)
        link = 0 if a.handoff_id == retry_of else 1 if slot else 2
        if a.handoff_id == b.handoff_id or (link == 2 and a.handoff_id not in inferred):
            continue
        if a.t_in is not None and a.t_in < b.created and (a.t_out is None or a.t_out > b.created):
            found.append((link, a))
    if not found:
        return Resolved()
    link, a = min(found, key=lambda x: (x[0], x[1].created or 0, x[1].handoff_id))
    why, field, value = (
        (f"named by {sc.RETRY_OF}", sc.RETRY_OF, retry_of),
        ("the same task, to_agent and idempotency key", sc.IDEMPOTENCY_KEY, b.idem),
        (INFERRED_REASON, sc.OBJECTIVE_HASH, n.envelope("", sc.OBJECTIVE_HASH)),
    )[link]
    left = f"left it at {_when(a.t_out)}" if a.t_out is not None else "never left it"
    assert a.t_in is not None
    reason = Reason(
        "blind_retry",
        f"this attempt was created at {_when(b.created)} while {a.handoff_id} ({why}) was "
        f"unknown: it entered unknown at {_when(a.t_in)} and {left}",
        transition_span_id=str((n.create or {}).get("span_id", "")),
        other_handoff_id=a.handoff_id,
        field=field,
        value=value,
    )
    return Resolved(_others(n, [x.handoff_id for _l, x in found]), (), reason)


def _duplicate_execution(n: Neighbourhood) -> Resolved:
    """The attempts with the same idempotency key that committed before this one."""
    att = _attempts(n)
    b = att.get(n.handoff_id)
    if b is None or b.t_commit is None or not b.idem:
        return Resolved()
    found = [
        a for a in att.values()
        if a.idem == b.idem and a.t_commit is not None
        and (a.t_commit, a.handoff_id) < (b.t_commit, b.handoff_id)
    ]  # fmt: skip
    if not found:
        return Resolved()
    a = min(found, key=lambda x: (x.t_commit or 0, x.handoff_id))
    assert a.t_commit is not None
    reason = Reason(
        "duplicate_execution",
        f"this attempt committed at {_when(b.t_commit)}; {a.handoff_id}, holding the same "
        f"{sc.IDEMPOTENCY_KEY} = {b.idem}, had committed at {_when(a.t_commit)}: the side "
        "effect done twice",
        other_handoff_id=a.handoff_id,
        field=sc.IDEMPOTENCY_KEY,
        value=b.idem,
    )
    return Resolved(_others(n, [x.handoff_id for x in found]), (), reason)


# ---------------------------------------------------------------- the upstream handoff


def _upstream(n: Neighbourhood) -> tuple[str, int | None, int | None, str]:
    """(causation_id, its first counted verify time, its earliest receipt expiry, that
    expiry as stored) from the upstream handoff's rows, read by primary key."""
    cause = n.envelope("", sc.CAUSATION_ID)
    if not cause:
        return "", None, None, ""
    rows = fetch_rows(
        n.client,
        n.db,
        "tenant = {t:String} AND handoff_id = {h:String}",
        {"t": n.tenant, "h": cause},
        "toUnixTimestamp64Nano(time) AS time_ns, event, from_state, to_state, valid, attributes, "
        "capabilities, evidence_refs",
    )
    verified = [int(r["time_ns"]) for r in rows if r["valid"] and
                (r["from_state"], r["event"], r["to_state"]) == ("committed", "verify", "verified")]  # fmt: skip
    expiries = [
        (t, text)
        for r in rows
        if r["valid"] and r["event"] in ("commit", "resolve_committed")
        for text in [str(r["attributes"].get(sc.RECEIPT_EXPIRES_AT, ""))]
        for t in [parse_time(text)]
        if t is not None
    ]
    first = min(expiries, default=(None, ""))
    return cause, min(verified, default=None), first[0], first[1]


def _consumed_before_verified(n: Neighbourhood) -> Resolved:
    cause, verified, _exp, _text = _upstream(n)
    own = n.create
    if not cause or own is None:
        return Resolved()
    when = (
        f"was verified only at {_when(verified)}" if verified is not None else "was never verified"
    )
    reason = Reason(
        "consumed_before_verified",
        f"{_step(own)} consumes the result of {cause} ({sc.CAUSATION_ID}), which {when}",
        transition_span_id=str(own.get("span_id", "")),
        other_handoff_id=cause,
        field=sc.CAUSATION_ID,
        value=cause,
    )
    return Resolved(_others(n, [cause]), (), reason)


def _expired_receipt_used(n: Neighbourhood) -> Resolved:
    cause, _verified, exp, text = _upstream(n)
    own = n.create
    if not cause or own is None or exp is None:
        return Resolved(_others(n, [cause]))
    reason = Reason(
        "expired_receipt_used",
        f"{_step(own)} consumes the result of {cause} ({sc.CAUSATION_ID}) after its receipt "
        f"expired ({sc.RECEIPT_EXPIRES_AT} = {text})",
        transition_span_id=str(own.get("span_id", "")),
        other_handoff_id=cause,
        field=sc.CAUSATION_ID,
        value=cause,
    )
    return Resolved(_others(n, [cause]), (), reason)


# ---------------------------------------------------------------- the task's expert calls


def _fan_out_all(n: Neighbourhood) -> Resolved:
    """The task's other agent-as-tool calls by the same orchestrator."""
    task, orchestrator = n.envelope("task_id"), n.envelope("from_agent")
    res = n.client.query(
        f"""SELECT handoff_id, max(from_agent), max(to_agent), max(topology)
        FROM {n.db}.handoff_summary
        WHERE tenant = {{t:String}} AND handoff_id IN (
            SELECT handoff_id FROM {n.db}.handoff_tasks
            WHERE tenant = {{t:String}} AND task_id = {{k:String}})
        GROUP BY handoff_id""",
        parameters={"t": n.tenant, "k": task},
        settings=POINT_LOOKUP,
    ).result_rows
    calls = [(str(h), str(b)) for h, a, b, topo in res
             if a == orchestrator and topo == "agent_as_tool" and b]  # fmt: skip
    experts = sorted({b for _h, b in calls})
    reason = Reason(
        "fan_out_all",
        f"its orchestrator {orchestrator} called {len(experts)} distinct experts in task "
        f"{task} ({', '.join(experts)}): every expert it called in the window",
        field=sc.FROM_AGENT,
        value=orchestrator,
    )
    return Resolved(_others(n, [h for h, _b in calls]), (), reason)


# ---------------------------------------------------------------- fleet groups


def default_fleet(n: Neighbourhood) -> Resolved:
    """The reference of a fleet kind without a resolver of its own (_why_fleet.hour_of)."""
    return Resolved((), _why_fleet.hour_of(n))


def _fleet(resolve: Callable[[Neighbourhood], _why_fleet.Found]) -> Resolver:
    def run(n: Neighbourhood) -> Resolved:
        refs, reason = resolve(n)
        return Resolved((), refs, reason)

    return run


def _own(kind: str) -> Resolver:
    """A topology kind: no other handoff, the reason from its own rows (_why_topology)."""

    def run(n: Neighbourhood) -> Resolved:
        from analytics._sql.topology import thresholds

        return Resolved((), (), _why_topology.REASONS[kind](n.rows, thresholds()))

    return run


def _budget(kind: str) -> Resolver:
    """A budget kind: no other handoff, the reason from its own rows at the package's clock
    (_why_budget)."""

    def run(n: Neighbourhood) -> Resolved:
        from analytics._sql.cohort import ns

        return Resolved((), (), _why_budget.REASONS[kind](n.rows, as_of_ns=ns(n.window.clock())))

    return run


def _named(resolve: Callable[[Neighbourhood], tuple[tuple[str, ...], Reason | None]]) -> Resolver:
    """A resolver returning (the other handoffs, the reason): _why_inferred, _why_queue."""

    def run(n: Neighbourhood) -> Resolved:
        others, reason = resolve(n)
        return Resolved(_others(n, others), (), reason)

    return run


#: kind -> its resolver. A cross kind without one lists no other handoff; a fleet kind
#: without one gets default_fleet.
RESOLVERS: Final[Mapping[str, Resolver]] = {
    "idempotency_conflict": _idempotency,
    "stale_fence": _stale_fence,
    "bounce": _bounce,
    "blind_retry": _blind_retry,
    "duplicate_execution": _duplicate_execution,
    "consumed_before_verified": _consumed_before_verified,
    "expired_receipt_used": _expired_receipt_used,
    "fan_out_all": _fan_out_all,
    **{kind: _own(kind) for kind in _why_topology.REASONS},
    "rejection_spike": _fleet(_why_fleet.rejection_spike),
    "sustained_rejections": _fleet(_why_fleet.sustained_rejections),
    **{kind: _budget(kind) for kind in _why_budget.REASONS},
    **{kind: _named(fn) for kind, fn in _why_inferred.RESOLVE.items()},
    "consumer_stalled": _named(_why_queue.consumer_stalled),
}
