"""SQL of consumer_stalled: a shared-queue message its consumer never took while the queue
went on, as a pass of analytics/_sql/anomalies.py.

consumer_lag is measured on the consumer's `accept`; a consumer that stopped never accepts,
so its lag never shows. Here the producer's `create` carries where it enqueued the message
(`handoff.queue.name`, `handoff.queue.offset`), and a message is stalled when:
  - it is a cohort handoff of topology `shared_queue` with a non-empty to_agent (the
    consumer) whose counted create rows carry `queue.offset` (o: the greatest; the queue Q:
    the greatest `queue.name`, '' when absent);
  - it never reached `accepted` (or a state after it) nor `rejected` (counted transitions:
    the consumer neither took nor refused it), nor `canceled` or `escalated` (the sender
    withdrew it: nobody waits on it; an expired message was given up, it counts);
  - as_of - created > the stall threshold (HANDOFFS_CONSUMER_STALL_S, seconds; strictly);
  - the queue's head moved past it: a stored `create` or `accept` row of the same tenant on
    Q, timestamped after the message's created time and at or before as_of, carries a
    `queue.offset` or `queue.head_offset` greater than o.

Cost: the waiting messages are picked from the cohort's summary rows (bit tests); only their
create rows are read from the transitions (PREWHERE on event and the typed topology_attrs,
then by primary key); the queue rows come from the transitions carrying a topology attribute
(topology_attrs) between the earliest waiting message and as_of, on the waiting messages'
queues only, each joined to the first queue row after it (ASOF) whose suffix maximum gives
the greatest offset seen after the message. Definitions: docs/metrics.md.
"""

from __future__ import annotations

from typing import Final

from analytics._sql import contract as cs
from analytics._sql.cohort import Window, cohort_sql, ts
from collector import semconv as sc
from collector.contract import State
from foundation import settings

__all__ = ["ANSWERED_MASK", "PASSES", "enqueued_sql", "stall_pass", "stall_seconds", "waiting_sql"]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {"stall": ("consumer_stalled",)}
_IS_CREATE: Final = "(valid AND from_state = '' AND to_state = 'created')"


def stall_seconds(value: int | None = None) -> int:
    """The stall threshold (s) from the argument, HANDOFFS_CONSUMER_STALL_S, the default (300).
    ValueError naming the variable on a bad value or one < 0."""
    s = settings.resolve_int(settings.CONSUMER_STALL_S, value)
    if s < 0:
        raise ValueError(f"{settings.CONSUMER_STALL_S.env} must be an integer >= 0, got {s}")
    return s


def _int(name: str) -> str:
    return f"toInt64OrNull(attributes['{name}'])"


#: the counted states that end a message's wait other than being taken (accepted or beyond):
#: the consumer refused it, or the sender withdrew it
ANSWERED_MASK: Final = cs.into_mask({State.REJECTED, State.CANCELED, State.ESCALATED})


def waiting_sql(db: str, window: Window, tenant: bool) -> str:
    """The cohort's shared-queue handoffs with a consumer that reached neither accepted (or
    beyond) nor rejected, canceled or escalated: tenant, handoff_id, created, to_agent."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("to_agent", "topology"))
    return f"""SELECT tenant, handoff_id, created, to_agent FROM ({cohort})
WHERE topology = 'shared_queue' AND to_agent != '' AND NOT is_a
  AND NOT {cs.has("tmask", ANSWERED_MASK)}"""


def enqueued_sql(db: str, within: str) -> str:
    """Per handoff of `within` (SQL of tenant, handoff_id rows) whose counted create rows
    carry a queue offset: tenant, handoff_id, queue (greatest name), offset (greatest)."""
    return f"""SELECT tenant, handoff_id, max(attributes['{sc.QUEUE_NAME}']) AS queue,
    max({_int(sc.QUEUE_OFFSET)}) AS offset
FROM {db}.handoff_transitions
PREWHERE event = 'create' AND topology_attrs
WHERE {_IS_CREATE} AND (tenant, handoff_id) IN ({within})
GROUP BY tenant, handoff_id
HAVING offset IS NOT NULL"""


def stall_pass(db: str, window: Window, tenant: bool, stall_s: int | None = None) -> str:
    """tenant, handoff_id, consumer_stalled (true) per stalled message (module doc)."""
    s = stall_seconds(stall_s)
    now = ts(window.clock())
    old = f"toUnixTimestamp64Nano({now}) - toUnixTimestamp64Nano(created) > {s * 1_000_000_000}"
    o, h = _int(sc.QUEUE_OFFSET), _int(sc.QUEUE_HEAD_OFFSET)
    ahead = f"greatest(coalesce({o}, {h}), coalesce({h}, {o}))"  # NULL when neither
    waits = (
        "SELECT w.1 AS tenant, w.2 AS handoff_id, w.3 AS created"
        " FROM (SELECT arrayJoin(waits) AS w)"
    )
    enq = enqueued_sql(db, "SELECT tenant, handoff_id FROM waited")
    # the waiting messages, read once into constants (few): their queues bound the scan
    return f"""WITH (
    SELECT groupArray((tenant, handoff_id, created)) FROM ({waiting_sql(db, window, tenant)})
    WHERE {old}
) AS waits,
waited AS ({waits}),
(SELECT (groupArray((e.tenant, e.handoff_id, e.queue, assumeNotNull(e.offset), w.created)),
         if(count() = 0, {now} + INTERVAL 1 SECOND, min(w.created)),
         groupUniqArray((e.tenant, e.queue)))
 FROM ({enq}) AS e
 INNER JOIN waited AS w ON e.tenant = w.tenant AND e.handoff_id = w.handoff_id) AS found
SELECT m.1 AS tenant, m.2 AS handoff_id, true AS consumer_stalled
FROM (SELECT arrayJoin(found.1) AS m, m.1 AS t, m.3 AS q, m.5 AS created) AS e
ASOF INNER JOIN (
    SELECT tenant, queue, time,
        max(off) OVER (PARTITION BY tenant, queue ORDER BY time DESC
                       RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ahead
    FROM (
        SELECT tenant, attributes['{sc.QUEUE_NAME}'] AS queue, time, {ahead} AS off
        FROM {db}.handoff_transitions
        PREWHERE event IN ('create', 'accept') AND topology_attrs
        WHERE time > found.2 AND time <= {now} AND has(found.3, (tenant, queue))
          AND off IS NOT NULL
    )
) AS h ON e.t = h.tenant AND e.q = h.queue AND h.time > e.created
WHERE h.ahead > m.4"""
