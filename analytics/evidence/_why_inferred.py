"""Why an inferred kind flagged a handoff (analytics.oracle.inferred: what senders do, not
what they declare), and which other handoffs it involves: the resolvers
analytics.evidence._why_store registers for retry_after_final_refusal,
keyless_duplicate_write, grant_caller_mismatch, missing_grant and out_of_order_version, and
the inferred link of a blind retry.

Each function takes the handoff's Neighbourhood (analytics.evidence._evaluate) and returns
(the other handoffs involved, Reason or None when the rows do not show the kind). The
retry kinds and the task's versions read Neighbourhood.related_rows (its task's handoffs,
the ones its retry_of names); keyless_duplicate_write reads the tenant's earlier keyless
creates to the same agent with the same payload hash (one small query, then those
handoffs' rows by primary key). The facts are oracle.inferred's readings, with the
policy the pass uses (_sql.inferred_policy.policy: HANDOFFS_KEYLESS_WINDOW_S,
HANDOFFS_REQUIRE_GRANTS); a reason explains a verdict, it never makes one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.inferred_policy import SIDE_EFFECT_TOPOLOGY, policy
from analytics._sql.rows import fetch_rows
from analytics.evidence._why import Reason, _first, _secs, _span, _step, _when
from analytics.oracle.audit import is_create
from analytics.oracle.funnel import counted
from analytics.oracle.inferred import (
    FINAL,
    INFERRED_REASON,
    Request,
    _keyless,
    _version,
    request,
    retry_links,
)
from collector import semconv as sc

if TYPE_CHECKING:
    from analytics.evidence._evaluate import Neighbourhood

__all__ = ["RESOLVE", "inferred_links"]

Row = Mapping[str, Any]
Found = tuple[tuple[str, ...], Reason | None]
_S: Final = 1_000_000_000


def _own_request(n: Neighbourhood, rows: Sequence[Row] | None = None) -> Request:
    return request(n.tenant, n.handoff_id, rows if rows is not None else n.rows)


def inferred_links(n: Neighbourhood, kind: str) -> dict[str, str]:
    """The handoffs `kind` (blind_retry or retry_after_final_refusal) links the handoff to,
    among its related handoffs: {other handoff_id: link} (retry_of, same_key or inferred:
    oracle.inferred.retry_links)."""
    found = retry_links(n.related_rows()).get((n.tenant, n.handoff_id), [])
    out: dict[str, str] = {}
    for k, other, link in found:
        if k == kind:
            out.setdefault(other, link)
    return out


# ---------------------------------------------------------------- the attempt it retries


def retry_after_final_refusal(n: Neighbourhood) -> Found:
    """The attempts it retries (retry_of, or inferred) that had been refused with a final
    code before it was created; the reason names the one retry_of names, else the earliest
    refused."""
    links = inferred_links(n, "retry_after_final_refusal")
    b = _own_request(n)
    if not links or b.created is None:
        return (), None
    rows: dict[str, list[Row]] = defaultdict(list)
    for r in n.related_rows():
        rows[str(r["handoff_id"])].append(r)

    def refusal(h: str) -> Row | None:
        return _first(
            r
            for r in rows[h]
            if counted(r) and r["event"] == "reject" and (r.get("error_code") or "") in FINAL
        )

    refused = {h: rj for h in links if (rj := refusal(h)) is not None}
    if not refused:
        return tuple(sorted(links)), None
    a = min(refused, key=lambda h: (links[h] != "retry_of", int(refused[h]["time_ns"]), h))
    rj = refused[a]
    declared = links[a] == "retry_of"
    why = f"named by {sc.RETRY_OF}" if declared else INFERRED_REASON
    env = n.create or {}
    reason = Reason(
        "retry_after_final_refusal",
        f"this attempt was created at {_when(b.created)}, "
        f"{_secs(b.created - int(rj['time_ns']))} after {a} ({why}) was refused: "
        f"{_step(rj)} carries {sc.ERROR_CODE} = {rj.get('error_code')}, a final code "
        "(collector.semconv.FINAL_ERROR_CODES): the refusal will not change",
        transition_span_id=str(env.get("span_id", "")),
        other_handoff_id=a,
        field=sc.RETRY_OF if declared else sc.OBJECTIVE_HASH,
        value=b.retry_of if declared else b.objective_hash,
    )
    return tuple(sorted(links)), reason


# ---------------------------------------------------------------- its own envelope


def grant_caller_mismatch(n: Neighbourhood) -> Found:
    """The create whose grant names another caller than the envelope's sender."""
    b = _own_request(n)
    if not b.grant_caller or b.grant_caller == b.from_agent:
        return (), None
    c = _first(
        r
        for r in n.rows
        if is_create(r) and (r.get("attributes") or {}).get(sc.GRANT_CALLER) == b.grant_caller
    )
    if c is None:
        return (), None
    return (), _span(
        "grant_caller_mismatch",
        c,
        f"{_step(c)} carries {sc.GRANT_CALLER} = {b.grant_caller}; the envelope's from_agent "
        f"is {b.from_agent or '(none)'}: the grant was issued to another caller than the sender",
        sc.GRANT_CALLER,
        b.grant_caller,
    )


def missing_grant(n: Neighbourhood) -> Found:
    """The create asking for capabilities without any grant, where the policy requires one."""
    b = _own_request(n)
    if not policy().require_grants or not b.capabilities or b.has_grant:
        return (), None
    c = n.create
    if c is None:
        return (), None
    return (), _span(
        "missing_grant",
        c,
        f"{_step(c)} asks for {', '.join(b.capabilities)} ({sc.CAPABILITIES}) and no create "
        "row carries a handoff.grant.* attribute, where the policy requires a grant "
        "(HANDOFFS_REQUIRE_GRANTS=1)",
        sc.CAPABILITIES,
        json.dumps(list(b.capabilities)),
    )


# ---------------------------------------------------------------- the task's versions


def out_of_order_version(n: Neighbourhood) -> Found:
    """Its first row whose state_version is below one a row of the same task carried
    strictly earlier, and the handoffs whose rows carried those higher versions."""
    task_rows: dict[str, list[tuple[int, int, Row]]] = defaultdict(list)
    for r in n.related_rows():
        v = _version(r)
        if v is not None and str(r.get("tenant", n.tenant)) == n.tenant:
            task_rows[str(r.get("task_id") or "")].append((int(r["time_ns"]), v, r))
    others: set[str] = set()
    first: tuple[Row, int, Row] | None = None
    for r in sorted(n.rows, key=lambda r: (int(r["time_ns"]), str(r.get("span_id", "")))):
        v = _version(r)
        if v is None:
            continue
        t = int(r["time_ns"])
        above = [(x, w) for tx, w, x in task_rows[str(r.get("task_id") or "")] if tx < t and w > v]
        others |= {str(x["handoff_id"]) for x, _w in above}
        if above and first is None:
            x, w = max(above, key=lambda a: (a[1], -int(a[0]["time_ns"])))
            first = (r, w, x)
    if first is None:
        return tuple(sorted(others - {n.handoff_id})), None
    r, w, x = first
    who = "its own" if x["handoff_id"] == n.handoff_id else f"{x['handoff_id']}'s"
    reason = Reason(
        "out_of_order_version",
        f"{_step(r)} carries {sc.STATE_VERSION} = {_version(r)}, lower than the "
        f"{sc.STATE_VERSION} = {w} {who} {x['event']} at {_when(int(x['time_ns']))} (span "
        f"{x.get('span_id', '')}) carried earlier in task {r.get('task_id') or '(none)'}",
        transition_span_id=str(r.get("span_id", "")),
        other_handoff_id="" if x["handoff_id"] == n.handoff_id else str(x["handoff_id"]),
        field=sc.STATE_VERSION,
        value=str(_version(r)),
    )
    return tuple(sorted(others - {n.handoff_id})), reason


# ---------------------------------------------------------------- the earlier writes


def keyless_duplicate_write(n: Neighbourhood) -> Found:
    """The earlier keyless writes of the same payload to the same agent created within the
    keyless window before it (both committed by the package's clock); the reason names the
    latest of them, the one the pass pairs it with."""
    from analytics._sql.cohort import ns

    as_of = ns(n.window.clock())
    own = [r for r in n.rows if int(r["time_ns"]) <= as_of]
    b = _own_request(n, own)
    if not _keyless(b):
        return (), None
    assert b.created is not None
    window_s = policy().keyless_window_s
    lo = b.created - window_s * _S
    params = {"t": n.tenant, "h": n.handoff_id, "a": b.to_agent, "p": b.payload_hash}
    res = n.client.query(
        f"""SELECT DISTINCT handoff_id FROM {n.db}.handoff_transitions
        PREWHERE event = 'create'
        WHERE tenant = {{t:String}} AND handoff_id != {{h:String}}
          AND to_agent = {{a:String}} AND payload_hash = {{p:String}} AND idempotency_key = ''
          AND toUnixTimestamp64Nano(time) BETWEEN {{lo:Int64}} AND {{hi:Int64}}""",
        parameters={**params, "lo": lo, "hi": b.created},
    )
    cand = [str(h) for (h,) in res.result_rows]
    if not cand:
        return (), None
    by: dict[str, list[Row]] = defaultdict(list)
    for r in fetch_rows(
        n.client,
        n.db,
        "tenant = {t:String} AND handoff_id IN {ids:Array(String)}",
        {"t": n.tenant, "ids": cand},
    ):
        if int(r["time_ns"]) <= as_of:
            by[str(r["handoff_id"])].append(r)
    earlier = [
        a
        for h, rows in by.items()
        if _keyless(a := request(n.tenant, h, rows))
        and (a.to_agent, a.payload_hash) == (b.to_agent, b.payload_hash)
        and a.created is not None
        and (a.created, a.handoff_id) < (b.created, b.handoff_id)
        and b.created - a.created <= window_s * _S
    ]
    if not earlier:
        return (), None
    a = max(earlier, key=lambda x: (x.created or 0, x.handoff_id))
    assert a.created is not None
    what = (
        f"a {SIDE_EFFECT_TOPOLOGY} write" if _topology(n) == SIDE_EFFECT_TOPOLOGY else "a command"
    )
    env = n.create or {}
    reason = Reason(
        "keyless_duplicate_write",
        f"this write ({what} without {sc.IDEMPOTENCY_KEY}) to {b.to_agent} carries "
        f"{sc.PAYLOAD_HASH} = {b.payload_hash}, as {a.handoff_id} did, created "
        f"{_secs(b.created - a.created)} before it (within the {window_s} s keyless window, "
        "HANDOFFS_KEYLESS_WINDOW_S); both committed: the side effect done twice",
        transition_span_id=str(env.get("span_id", "")),
        other_handoff_id=a.handoff_id,
        field=sc.PAYLOAD_HASH,
        value=b.payload_hash,
    )
    return tuple(sorted(x.handoff_id for x in earlier)), reason


def _topology(n: Neighbourhood) -> str:
    return max((str(r.get("topology") or "") for r in n.rows if is_create(r)), default="")


#: kind -> its resolver
RESOLVE: Final[Mapping[str, Callable[[Neighbourhood], Found]]] = {
    "retry_after_final_refusal": retry_after_final_refusal,
    "keyless_duplicate_write": keyless_duplicate_write,
    "grant_caller_mismatch": grant_caller_mismatch,
    "missing_grant": missing_grant,
    "out_of_order_version": out_of_order_version,
}
