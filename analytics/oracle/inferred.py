"""The kinds inferred from what senders do rather than what they declare, in plain Python over
transition rows: the oracle the SQL of analytics/_sql/inferred.py (and the inferred half of
blind_retry in the retry pass) is tested against. Definitions: docs/metrics.md.

  retry_after_final_refusal  a new attempt of a request that was rejected with a code the
                             vocabulary marks final (collector.semconv.FINAL_ERROR_CODES),
                             created after that reject
  keyless_duplicate_write    a committed side-effecting write (a command, or any handoff on
                             the shared_queue topology) without an idempotency key, carrying
                             the payload hash of another such write to the same agent created
                             at most `keyless_window_s` before it
  grant_caller_mismatch      the grant's caller is set and is not the envelope's from_agent
  missing_grant              capabilities requested without any grant attribute, where the
                             policy requires grants
  out_of_order_version       a transition carrying a state_version lower than one a transition
                             of the same task carried at an earlier time

A retry is linked to the attempt it retries by `handoff.retry_of`, or, without one, inferred:
the same task, from_agent, to_agent and objective hash (`handoff.objective.hash` of the
create). `retry_links` says which link made each retry kind fire, so an evidence package can
mark a blind retry "inferred: same task, agents and objective".

Rows as in analytics.oracle.funnel, plus `tenant`, `task_id`, `from_agent`, `to_agent`,
`topology`, `idempotency_key`, `payload_hash`, `capabilities`, `error_code`, `state_version`
and `attributes` (the map as stored). A row without the `payload_hash` or `state_version`
column is read from its attributes (as the stored column: the text as given, an integer or
None). Envelope values are the greatest over the handoff's counted create rows, as in
handoff_summary; times are ns.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from analytics._sql.inferred_policy import SIDE_EFFECT_KIND, SIDE_EFFECT_TOPOLOGY, Policy
from analytics.oracle.funnel import Row, counted
from collector import semconv as sc

__all__ = [
    "INFERRED_KINDS",
    "INFERRED_REASON",
    "Request",
    "inferred_anomalies",
    "inferred_link",
    "request",
    "retry_links",
]

#: the kinds inferred_anomalies computes (docs/metrics.md), in report order
INFERRED_KINDS: Final = (
    "retry_after_final_refusal",
    "keyless_duplicate_write",
    "grant_caller_mismatch",
    "missing_grant",
    "out_of_order_version",
)
#: what an evidence package says of a retry linked by inference, not by the sender
INFERRED_REASON: Final = "inferred: same task, agents and objective"
#: the rejection codes a retry of the same request cannot change
FINAL: Final = frozenset(sc.FINAL_ERROR_CODES)
_GRANT_PREFIX: Final = "handoff.grant."
_INT = re.compile(r"^-?[0-9]+$")


def _attrs(r: Row) -> Mapping[str, str]:
    return r.get("attributes") or {}


def _is_create(r: Row) -> bool:
    return (
        bool(r.get("valid", True))
        and r["event"] == "create"
        and not r["from_state"]
        and r["to_state"] == "created"
    )


def _version(r: Row) -> int | None:
    """The stored state_version of a row (the column, else its attribute as stored)."""
    if "state_version" in r:
        v = r["state_version"]
        return None if v is None else int(v)
    text = _attrs(r).get(sc.STATE_VERSION)
    return int(text) if isinstance(text, str) and _INT.match(text) else None


def _payload_hash(r: Row) -> str:
    if "payload_hash" in r:
        return str(r["payload_hash"] or "")
    return str(_attrs(r).get(sc.PAYLOAD_HASH, ""))


@dataclass(frozen=True, slots=True)
class Request:
    """What the inferred kinds read of one handoff (times in ns, None when unseen)."""

    tenant: str
    handoff_id: str
    task_id: str
    from_agent: str
    to_agent: str
    objective_hash: str
    retry_of: str
    idempotency_key: str
    payload_hash: str
    side_effect: bool
    created: int | None
    t_commit: int | None
    t_final_reject: int | None
    grant_caller: str
    has_grant: bool
    capabilities: tuple[str, ...]


def request(tenant: str, handoff_id: str, rows: Sequence[Row]) -> Request:
    """One handoff's Request from all its stored rows."""
    cr = [r for r in rows if _is_create(r)]

    def env(get: Callable[[Row], object]) -> str:
        return max((str(get(r) or "") for r in cr), default="")

    rejects = [
        int(r["time_ns"])
        for r in rows
        if counted(r) and r["event"] == "reject" and (r.get("error_code") or "") in FINAL
    ]
    commits = [int(r["time_ns"]) for r in rows if counted(r) and r["to_state"] == "committed"]
    topology = env(lambda r: r.get("topology"))
    kind = env(lambda r: _attrs(r).get(sc.MESSAGE_KIND))
    return Request(
        tenant=tenant,
        handoff_id=handoff_id,
        task_id=max((str(r.get("task_id") or "") for r in rows), default=""),
        from_agent=env(lambda r: r.get("from_agent")),
        to_agent=env(lambda r: r.get("to_agent")),
        objective_hash=env(lambda r: _attrs(r).get(sc.OBJECTIVE_HASH)),
        retry_of=env(lambda r: _attrs(r).get(sc.RETRY_OF)),
        idempotency_key=env(lambda r: r.get("idempotency_key")),
        payload_hash=env(_payload_hash),
        side_effect=topology == SIDE_EFFECT_TOPOLOGY or kind == SIDE_EFFECT_KIND,
        created=min((int(r["time_ns"]) for r in cr), default=None),
        t_commit=min(commits, default=None),
        t_final_reject=min(rejects, default=None),
        grant_caller=env(lambda r: _attrs(r).get(sc.GRANT_CALLER)),
        has_grant=any(k.startswith(_GRANT_PREFIX) for r in cr for k in _attrs(r)),
        capabilities=tuple(max((list(r.get("capabilities") or ()) for r in cr), default=[])),
    )


def inferred_link(a: Request, b: Request) -> bool:
    """B is inferred to retry A: B names no retry_of, and both have the same tenant, task
    (non-empty), from_agent, to_agent and objective hash (non-empty)."""
    return (
        a.handoff_id != b.handoff_id
        and a.tenant == b.tenant
        and not b.retry_of
        and bool(b.task_id)
        and (a.task_id, a.from_agent, a.to_agent) == (b.task_id, b.from_agent, b.to_agent)
        and bool(b.objective_hash)
        and a.objective_hash == b.objective_hash
    )


def _refused_retry(a: Request, b: Request) -> str | None:
    """How B retries A after A's final refusal ("retry_of" or "inferred"), or None."""
    if a.t_final_reject is None or b.created is None or b.created <= a.t_final_reject:
        return None
    if a.tenant != b.tenant or a.handoff_id == b.handoff_id:
        return None
    if b.retry_of == a.handoff_id:
        return "retry_of"
    return "inferred" if inferred_link(a, b) else None


def _keyless(r: Request) -> bool:
    return (
        r.created is not None
        and r.t_commit is not None
        and not r.idempotency_key
        and bool(r.payload_hash)
        and r.side_effect
    )


def _by_handoff(rows: Iterable[Row]) -> dict[tuple[str, str], list[Row]]:
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), r["handoff_id"])].append(r)
    return by_h


def _out_of_order(by_h: Mapping[tuple[str, str], Sequence[Row]]) -> set[tuple[str, str]]:
    """Handoffs with a row whose state_version is below the greatest a row of the same task
    (tenant, the row's task_id) carried at a strictly earlier time."""
    per_task: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for (tenant, h), hr in by_h.items():
        for r in hr:
            v = _version(r)
            if v is not None:
                per_task[(tenant, str(r.get("task_id") or ""))].append((int(r["time_ns"]), v, h))
    out: set[tuple[str, str]] = set()
    for (tenant, _task), seq in per_task.items():
        seq.sort()
        hi: int | None = None  # greatest version at times before the current one
        i = 0
        while i < len(seq):
            j = i
            while j < len(seq) and seq[j][0] == seq[i][0]:
                j += 1
            for _t, v, h in seq[i:j]:
                if hi is not None and v < hi:
                    out.add((tenant, h))
            top = max(v for _t, v, _h in seq[i:j])
            hi = top if hi is None else max(hi, top)
            i = j
    return out


def inferred_anomalies(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, pol: Policy
) -> dict[tuple[str, str], list[str]]:
    """INFERRED_KINDS of the cohort (handoffs whose first counted create is in [start_ns,
    end_ns)), from all stored rows (any tenants): {(tenant, handoff_id): sorted kinds}.

    keyless_duplicate_write flags every write of a group but the first: B when another
    keyless write A (same tenant, to_agent and payload hash, both committed) comes before
    it in (created, handoff_id) order, created at most pol.keyless_window_s before B."""
    by_h = _by_handoff(rows)
    req = {k: request(k[0], k[1], v) for k, v in by_h.items()}
    late = _out_of_order(by_h)
    window_ns = pol.keyless_window_s * 1_000_000_000
    writes: dict[tuple[str, str, str], list[Request]] = defaultdict(list)
    for r in req.values():
        if _keyless(r):
            writes[(r.tenant, r.to_agent, r.payload_hash)].append(r)
    duplicates: set[tuple[str, str]] = set()
    for group in writes.values():
        group.sort(key=lambda r: (r.created, r.handoff_id))
        for prev, cur in itertools.pairwise(group):
            assert prev.created is not None and cur.created is not None
            if cur.created - prev.created <= window_ns:
                duplicates.add((cur.tenant, cur.handoff_id))
    by_tenant: dict[str, list[Request]] = defaultdict(list)
    for r in req.values():
        by_tenant[r.tenant].append(r)
    out: dict[tuple[str, str], list[str]] = {}
    for key, b in req.items():
        if b.created is None or not (start_ns <= b.created < end_ns):
            continue
        kinds: set[str] = set()
        if any(_refused_retry(a, b) for a in by_tenant[b.tenant]):
            kinds.add("retry_after_final_refusal")
        if key in duplicates:
            kinds.add("keyless_duplicate_write")
        if b.grant_caller and b.grant_caller != b.from_agent:
            kinds.add("grant_caller_mismatch")
        if pol.require_grants and b.capabilities and not b.has_grant:
            kinds.add("missing_grant")
        if key in late:
            kinds.add("out_of_order_version")
        out[key] = sorted(kinds)
    return out


def _blind(a_rows: Sequence[Row], b: Request) -> bool:
    """A was unknown when B was created: entered before, left after (or never)."""
    c = [r for r in a_rows if counted(r)]
    t_in = min((int(r["time_ns"]) for r in c if r["to_state"] == "unknown"), default=None)
    t_out = min((int(r["time_ns"]) for r in c if r["from_state"] == "unknown"), default=None)
    assert b.created is not None
    return t_in is not None and t_in < b.created and (t_out is None or t_out > b.created)


def retry_links(rows: Iterable[Row]) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """Every retry kind a link makes fire, per retrying handoff with a counted create:
    {(tenant, handoff_id): sorted (kind, other handoff_id, link)}, kind blind_retry or
    retry_after_final_refusal, link "retry_of", "same_key" (blind_retry's same task,
    to_agent and idempotency key) or "inferred" (inferred_link). A blind retry whose only
    links are "inferred" is one the sender did not declare (INFERRED_REASON)."""
    by_h = _by_handoff(rows)
    req = {k: request(k[0], k[1], v) for k, v in by_h.items()}
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for key, b in req.items():
        if b.created is None:
            continue
        found: set[tuple[str, str, str]] = set()
        for akey, a in req.items():
            if akey == key or a.tenant != b.tenant:
                continue
            link = _refused_retry(a, b)
            if link is not None:
                found.add(("retry_after_final_refusal", a.handoff_id, link))
            if not _blind(by_h[akey], b):
                continue
            if b.retry_of == a.handoff_id:
                found.add(("blind_retry", a.handoff_id, "retry_of"))
            elif b.idempotency_key and (a.task_id, a.to_agent, a.idempotency_key) == (
                b.task_id,
                b.to_agent,
                b.idempotency_key,
            ):
                found.add(("blind_retry", a.handoff_id, "same_key"))
            elif inferred_link(a, b):
                found.add(("blind_retry", a.handoff_id, "inferred"))
        if found:
            out[key] = sorted(found)
    return out
