"""Why consumer_stalled flagged a shared-queue message, and which later messages show the
queue went on without it: the resolver analytics.evidence._why_store registers for the kind (the
pass: analytics/_sql/stall.py, definitions docs/metrics.md).

A stalled message is a cross-handoff finding: what makes it a stall rather than a quiet
queue is the later rows on the same queue that moved its head past the message's offset.
`consumer_stalled(n)` names those messages (the handoffs whose create or accept on the
queue, after the message was created and by the package's clock, carried an offset or head
offset above its own; the earliest NAMED of them, so a busy queue's package stays small) and
says how many there were. One query: the tenant's create and accept rows carrying a
topology attribute on that queue, in that time range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from analytics._sql.stall import stall_seconds
from analytics.evidence._why import Reason, _secs, _step, _when
from analytics.oracle.audit import is_create
from analytics.oracle.topology import parse_int
from collector import semconv as sc

if TYPE_CHECKING:
    from analytics.evidence._evaluate import Neighbourhood

__all__ = ["NAMED", "consumer_stalled"]

#: the most later messages a package names (the earliest first)
NAMED: Final = 10
Found = tuple[tuple[str, ...], Reason | None]


def _int(name: str) -> str:
    return f"toInt64OrNull(attributes['{name}'])"


def consumer_stalled(n: Neighbourhood) -> Found:
    """The later messages of its queue past its offset (at most NAMED, the earliest first),
    and the reason naming the first of them."""
    from analytics._sql.cohort import ns

    cr = [r for r in n.rows if is_create(r)]
    got = [parse_int((r.get("attributes") or {}).get(sc.QUEUE_OFFSET)) for r in cr]
    offsets = [x for x in got if x is not None]
    if not cr or not offsets:
        return (), None
    offset = max(offsets)
    queue = max(str((r.get("attributes") or {}).get(sc.QUEUE_NAME, "")) for r in cr)
    created = min(int(r["time_ns"]) for r in cr)
    as_of = ns(n.window.clock())
    o, h = _int(sc.QUEUE_OFFSET), _int(sc.QUEUE_HEAD_OFFSET)
    res = n.client.query(
        f"""SELECT handoff_id, t, first_event, ahead, count() OVER () AS later FROM (
            SELECT handoff_id, min(toUnixTimestamp64Nano(time)) AS t,
                argMin(event, time) AS first_event,
                max(greatest(coalesce({o}, {h}), coalesce({h}, {o}))) AS ahead
            FROM {n.db}.handoff_transitions
            PREWHERE event IN ('create', 'accept') AND topology_attrs
            WHERE tenant = {{t:String}} AND attributes['{sc.QUEUE_NAME}'] = {{q:String}}
              AND toUnixTimestamp64Nano(time) > {{lo:Int64}}
              AND toUnixTimestamp64Nano(time) <= {{hi:Int64}}
              AND greatest(coalesce({o}, {h}), coalesce({h}, {o})) > {{o:Int64}}
            GROUP BY handoff_id)
        ORDER BY t, handoff_id LIMIT {NAMED}""",
        parameters={"t": n.tenant, "q": queue, "lo": created, "hi": as_of, "o": offset},
    ).result_rows
    if not res:
        return (), None
    later = int(res[0][4])
    first_h, first_t, first_event, ahead = res[0][:4]
    consumer = n.envelope("to_agent")
    more = (
        f"; {later} later messages of the queue did (the first {NAMED} named)"
        if later > NAMED
        else f"; {later} later message(s) of the queue did"
        if later > 1
        else ""
    )
    env = min(cr, key=lambda r: (int(r["time_ns"]), str(r.get("span_id", ""))))
    reason = Reason(
        "consumer_stalled",
        f"{_step(env)} enqueued it at {sc.QUEUE_OFFSET} = {offset} of queue "
        f"{queue or '(unnamed)'} for {consumer}, which had neither taken nor refused it at "
        f"{_when(as_of)}, {_secs(as_of - created)} later (over the {stall_seconds()} s of "
        f"HANDOFFS_CONSUMER_STALL_S), while the queue's head moved past it: {first_h}'s "
        f"{first_event} at {_when(int(first_t))} carried offset {ahead}{more}",
        transition_span_id=str(env.get("span_id", "")),
        other_handoff_id=str(first_h),
        field=sc.QUEUE_OFFSET,
        value=str(offset),
    )
    return tuple(sorted({str(r[0]) for r in res} - {n.handoff_id})), reason
