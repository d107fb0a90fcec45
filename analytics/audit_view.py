"""What the explorer shows of one handoff's protocol audit: its retry chain, the handoff it
consumes and those consuming it, its capability grant and its receipt's layers.

`handoff_links` reads the handoffs of the same task plus the ones this handoff names
(retry_of, causation_id, any task of the tenant) in two point queries; the rest are pure
functions over an evidence package (analytics.evidence_package) and those rows. Consumers
are searched in the same task only: a causation id naming this handoff from another task
is not found (that would read every create of the tenant). Times are aware UTC datetimes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from analytics._sql import contract as cs
from analytics._sql.cohort import check_db
from analytics._sql.rows import POINT_LOOKUP
from collector import semconv as sc

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "GRANT_USE_EVENTS",
    "AuditLinks",
    "GrantView",
    "LinkedHandoff",
    "ReceiptView",
    "grant_view",
    "handoff_links",
    "links_from_rows",
    "parse_utc",
    "receipt_view",
]

#: events that use the grant: the grant must not have expired before them
GRANT_USE_EVENTS: Final = ("create", "start", "prepare", "commit")
_RECEIPT_EVENTS: Final = ("commit", "resolve_committed")
_READ_BACK_EVENTS: Final = ("verify", "verify_fail")


def parse_utc(text: Any) -> datetime | None:
    """An ISO-8601 time as an aware UTC datetime (naive read as UTC; nanoseconds cut to
    microseconds); None for empty or unparsable text."""
    if not isinstance(text, str) or not text.strip():
        return None
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    head, dot, rest = raw.partition(".")
    if dot:  # fromisoformat takes at most 6 fractional digits
        digits = "".join(c for c in rest if c.isdigit())
        raw = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _list(v: Any) -> tuple[str, ...]:
    """A string[] attribute as stored (JSON text) or already decoded, as a tuple."""
    if isinstance(v, list | tuple):
        return tuple(str(x) for x in v)
    if isinstance(v, str) and v.startswith("["):
        try:
            return tuple(str(x) for x in json.loads(v))
        except ValueError:
            return (v,)
    return (v,) if isinstance(v, str) and v else ()


# ---------------------------------------------------------------- links


@dataclass(frozen=True, slots=True)
class LinkedHandoff:
    """One handoff next to the one shown: ids, parties, attempt number, state."""

    handoff_id: str
    task_id: str
    from_agent: str
    to_agent: str
    attempt: int | None
    created: datetime | None
    last_state: str
    retry_of: str
    causation_id: str


@dataclass(frozen=True, slots=True)
class AuditLinks:
    """The retry chain (every attempt of this task at this target with this key, or linked
    by retry_of; this one included; attempt order), the attempts right before and after
    this one, the handoff this one consumes (its causation_id), and its consumers."""

    handoff_id: str
    attempts: tuple[LinkedHandoff, ...]
    previous: LinkedHandoff | None
    next: tuple[LinkedHandoff, ...]
    upstream: LinkedHandoff | None
    #: causation_id naming no stored handoff of the tenant (a message id, or not stored)
    upstream_unresolved: str
    downstream: tuple[LinkedHandoff, ...]


def _linked(r: Mapping[str, Any]) -> LinkedHandoff:
    created = r.get("created")
    if isinstance(created, datetime):
        created = created.replace(tzinfo=UTC) if created.tzinfo is None else created
    else:
        created = None
    try:
        attempt: int | None = int(str(r.get("attempt") or ""))
    except ValueError:
        attempt = None
    return LinkedHandoff(
        handoff_id=str(r["handoff_id"]),
        task_id=str(r.get("task_id") or ""),
        from_agent=str(r.get("from_agent") or ""),
        to_agent=str(r.get("to_agent") or ""),
        attempt=attempt,
        created=created,
        last_state=str(r.get("last_state") or ""),
        retry_of=str(r.get("retry_of") or ""),
        causation_id=str(r.get("causation_id") or ""),
    )


def _order(h: LinkedHandoff) -> tuple[int, datetime, str]:
    return (
        h.attempt if h.attempt is not None else 1,
        h.created or datetime.min.replace(tzinfo=UTC),
        h.handoff_id,
    )


def links_from_rows(rows: Sequence[Mapping[str, Any]], handoff_id: str) -> AuditLinks:
    """AuditLinks of `handoff_id` among `rows` (dicts with LinkedHandoff's fields plus
    `idempotency_key`). Pure. ValueError when handoff_id is not among the rows."""
    by_id = {str(r["handoff_id"]): r for r in rows}
    if handoff_id not in by_id:
        raise ValueError(f"handoff {handoff_id!r} is not among the rows")
    hs = {k: _linked(r) for k, r in by_id.items()}
    me, mine = hs[handoff_id], by_id[handoff_id]
    key = str(mine.get("idempotency_key") or "")
    # the chain: retry_of links both ways from this one, plus same task, target and key
    chain = {handoff_id}
    grew = True
    while grew:
        grew = False
        for h in hs.values():
            if h.handoff_id in chain:
                if h.retry_of in hs and h.retry_of not in chain:
                    chain.add(h.retry_of)
                    grew = True
            elif h.retry_of in chain:
                chain.add(h.handoff_id)
                grew = True
    if key:
        chain |= {
            h.handoff_id
            for h in hs.values()
            if h.task_id == me.task_id
            and h.to_agent == me.to_agent
            and str(by_id[h.handoff_id].get("idempotency_key") or "") == key
        }
    attempts = tuple(sorted((hs[k] for k in chain), key=_order))
    pos = attempts.index(me)
    previous = hs.get(me.retry_of) or (attempts[pos - 1] if pos > 0 else None)
    nxt = tuple(h for h in attempts if h.retry_of == handoff_id)
    if not nxt and pos + 1 < len(attempts) and not attempts[pos + 1].retry_of:
        nxt = (attempts[pos + 1],)
    upstream = hs.get(me.causation_id) if me.causation_id else None
    downstream = tuple(sorted((h for h in hs.values() if h.causation_id == handoff_id), key=_order))
    return AuditLinks(
        handoff_id=handoff_id,
        attempts=attempts if len(attempts) > 1 else (),
        previous=previous,
        next=nxt,
        upstream=upstream,
        upstream_unresolved=me.causation_id if me.causation_id and upstream is None else "",
        downstream=downstream,
    )


def handoff_links(
    client: Client,
    *,
    database: str | None = None,
    tenant: str,
    handoff_id: str,
    task_id: str,
    named: Sequence[str] = (),
) -> AuditLinks:
    """AuditLinks of (tenant, handoff_id): the handoffs of `task_id` plus those in `named`
    (the handoff's retry_of and causation_id, from its package's envelope). ValueError for
    an empty handoff_id or when the handoff is not stored."""
    db = check_db(database)
    if not handoff_id:
        raise ValueError("handoff_id must be a non-empty string")
    ids = [n for n in named if n] + [handoff_id]
    pick = f"""handoff_id IN (
        SELECT handoff_id FROM {db}.handoff_tasks WHERE tenant = {{t:String}} AND task_id = {{k:String}})
        OR handoff_id IN {{ids:Array(String)}}"""
    sql = f"""
SELECT s.handoff_id AS handoff_id, s.task_id AS task_id, s.from_agent AS from_agent,
    s.to_agent AS to_agent, s.idempotency_key AS idempotency_key, s.created AS created,
    s.last_state AS last_state, c.attempt AS attempt, c.retry_of AS retry_of,
    c.causation_id AS causation_id
FROM (
    SELECT handoff_id, max(task_id) AS task_id, max(from_agent) AS from_agent,
        max(to_agent) AS to_agent, max(idempotency_key) AS idempotency_key,
        coalesce(min(created), min(first_seen)) AS created,
        {cs.last_state_expr("groupBitOr(tmask)")} AS last_state
    FROM {db}.handoff_summary
    WHERE tenant = {{t:String}} AND ({pick})
    GROUP BY handoff_id
) AS s
LEFT JOIN (
    SELECT handoff_id, any(attributes['{sc.ATTEMPT}']) AS attempt,
        any(attributes['{sc.RETRY_OF}']) AS retry_of,
        any(attributes['{sc.CAUSATION_ID}']) AS causation_id
    FROM {db}.handoff_transitions
    WHERE tenant = {{t:String}} AND event = 'create' AND ({pick})
    GROUP BY handoff_id
) AS c ON c.handoff_id = s.handoff_id
ORDER BY created, handoff_id
LIMIT 500
"""
    res = client.query(
        sql, parameters={"t": tenant, "k": task_id, "ids": ids}, settings=POINT_LOOKUP
    )
    rows = [dict(zip(res.column_names, r, strict=True)) for r in res.result_rows]
    return links_from_rows(rows, handoff_id)


# ---------------------------------------------------------------- grant and receipt


@dataclass(frozen=True, slots=True)
class GrantView:
    """The grant of a handoff's create, and what its own transitions say about it.

    `notes`: the grant's expiry passed before a create/start/prepare/commit ("expired at the
    time of start (…)"), capabilities asked for outside it, a tenant other than the stored.
    """

    caller: str
    subject: str
    tenant: str
    approval: str
    capabilities: tuple[str, ...]
    resources: tuple[str, ...]
    expires_at: datetime | None
    expires_text: str
    notes: tuple[str, ...]


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def grant_view(package: Mapping[str, Any]) -> GrantView | None:
    """The GrantView of an evidence package, None when its create carried no grant."""
    env = package.get("envelope") or {}
    g = {k.removeprefix("grant."): v for k, v in env.items() if k.startswith("grant.")}
    if not g:
        return None
    expires_text = str(g.get("expires_at") or "")
    expires = parse_utc(expires_text)
    notes: list[str] = []
    if expires is not None:
        for t in package.get("transitions") or []:
            at = parse_utc(t.get("time"))
            if t.get("event") in GRANT_USE_EVENTS and at is not None and at > expires:
                notes.append(f"expired at the time of {t['event']} ({_fmt(at)})")
    caps = _list(g.get("capabilities"))
    asked = _list(env.get("capabilities"))
    if "capabilities" in g:
        outside = [c for c in asked if c not in caps]
        if outside:
            notes.append("capabilities asked for outside the grant: " + ", ".join(outside))
    tenant = str(g.get("tenant") or "")
    stored = str(package.get("tenant") or "")
    if tenant and stored and tenant != stored:
        notes.append(f"issued for tenant {tenant}, stored under tenant {stored}")
    return GrantView(
        caller=str(g.get("caller") or ""),
        subject=str(g.get("subject") or ""),
        tenant=tenant,
        approval=str(g.get("approval") or ""),
        capabilities=caps,
        resources=_list(g.get("resources")),
        expires_at=expires,
        expires_text=expires_text,
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class ReceiptView:
    """A handoff's receipt in three layers: issued (id, at, until), read back (when, by
    whom, conflicts found), and used (consumers created after the expiry, in `notes`).
    `read_back` is None when no verify / verify_fail carries the attribute."""

    receipt_id: str
    issued_at: datetime | None
    expires_at: datetime | None
    expires_text: str
    read_back: bool | None
    read_back_at: datetime | None
    read_back_by: str
    conflicts: tuple[str, ...]
    notes: tuple[str, ...]


def receipt_view(
    package: Mapping[str, Any], consumers: Sequence[LinkedHandoff] = ()
) -> ReceiptView | None:
    """The ReceiptView of an evidence package, None when no commit issued a receipt id and
    nothing was read back. `consumers` (AuditLinks.downstream) are checked against the
    expiry and the read-back time."""
    ts = package.get("transitions") or []
    issued = [t for t in ts if t.get("event") in _RECEIPT_EVENTS]
    backs = [t for t in ts if t.get("event") in _READ_BACK_EVENTS]
    first = next((t for t in issued if (t.get("attributes") or {}).get(sc.RECEIPT_ID)), None)
    if first is None and not backs:
        return None
    attrs = (first or {}).get("attributes") or {}
    expires_text = str(attrs.get(sc.RECEIPT_EXPIRES_AT) or "")
    expires = parse_utc(expires_text)
    back = backs[0] if backs else None
    battrs = (back or {}).get("attributes") or {}
    raw = battrs.get(sc.RECEIPT_READ_BACK)
    read_back = None if raw is None else str(raw).lower() == "true"
    back_at = parse_utc(back.get("time")) if back else None
    notes: list[str] = []
    for c in consumers:
        if c.created is None:
            continue
        if expires is not None and c.created > expires:
            notes.append(f"used by {c.handoff_id} at {_fmt(c.created)}, after it expired")
        if back is None or (back_at is not None and c.created < back_at):
            notes.append(f"used by {c.handoff_id} at {_fmt(c.created)}, before it was read back")
    return ReceiptView(
        receipt_id=str(attrs.get(sc.RECEIPT_ID) or ""),
        issued_at=parse_utc(first.get("time")) if first else None,
        expires_at=expires,
        expires_text=expires_text,
        read_back=read_back,
        read_back_at=back_at,
        read_back_by=str(back.get("actor") or "") if back else "",
        conflicts=_list(battrs.get(sc.RECEIPT_CONFLICTS)),
        notes=tuple(notes),
    )
