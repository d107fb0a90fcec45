"""SQL of the promises an envelope makes about time and effort, as two passes of
analytics/_sql/anomalies.py (definitions: docs/metrics.md; oracle: analytics/oracle/budget.py).

  deadline  deadline_overrun: the envelope's own `deadline_ms` (none: not judged; the 300 s
            default only decides when a handoff is settled) against the time the handoff
            reached its outcome. Candidates come from the cohort's summary rows alone: a
            deadline, an outcome transition in tmask, and a row (last_seen) after the
            deadline, a superset of the flagged. Only their handoff_anomaly_state rows are
            read, by primary key: `first_times` (per counted transition its earliest time,
            sorted in machine order) names the first terminal state and when it was first
            reached.
  budget    tool_budget_exceeded and ack_missing: the rows that carry `handoff.tool_calls`
            on a result or `handoff.message.requires_ack = true` on a create, found by the
            typed `audit_attrs` flag (sql/017, PREWHERE) in the cohort's time range, name the
            candidates; their rows are then read by primary key (the create's budget, ttl
            and ack flag, the results' tool calls, the first counted accept or reject), and
            the cohort's summary rows of those handoffs only give `created`.
Two passes rather than one: each reads the cohort twice (candidates, then their rows), and
the two run side by side on the anomaly reader's two connections.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from analytics._sql import contract as cs
from analytics._sql.anomaly_state import TABLE as STATE_TABLE
from analytics._sql.cohort import Window, cohort_sql, ts
from collector import semconv as sc
from collector.contract import RESULT_EVENTS, STATE_RANK, TERMINAL, State

__all__ = [
    "ACK_EVENTS",
    "OUTCOME_STATES",
    "PASSES",
    "budget_pass",
    "deadline_pass",
]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {
    "deadline": ("deadline_overrun",),
    "budget": ("tool_budget_exceeded", "ack_missing"),
}
#: the terminal states that end the receiver's work: reached after the deadline, the
#: handoff overran it. expired, canceled and escalated are the sender ending it (at or after
#: the deadline that is the deadline enforced, not overrun); verified first means the commit
#: itself was never stored, so when it happened is unknown.
OUTCOME_STATES: Final = (State.COMMITTED, State.FAILED, State.REJECTED)
#: the counted transitions that acknowledge a message: created -> accepted / rejected
ACK_EVENTS: Final = (("accept", "accepted"), ("reject", "rejected"))
_IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"
#: the 1-based index of each state in handoff_anomaly_state's transition keys (the low byte
#: of a first_times key is its to-state: analytics._sql.anomaly_state.transition_key_sql)
_STATE_INDEX: Final = {str(s): i + 1 for i, s in enumerate(STATE_RANK)}


def _tuple(items: Iterable[object]) -> str:
    return "(" + ", ".join(f"'{x}'" for x in items) + ")"


def _idx(states: Iterable[object]) -> str:
    return "(" + ", ".join(str(_STATE_INDEX[str(s)]) for s in states) + ")"


def _ns(expr: str) -> str:
    return f"toUnixTimestamp64Nano({expr})"


def deadline_pass(db: str, window: Window, tenant: bool, keys: str | None = None) -> str:
    """deadline_overrun over the cohort (see the module doc). The first terminal state is the
    to-state of the least first_times key whose to-state is terminal (machine order: rank of
    from, rank of to, then event); the time it was reached is the earliest time of any
    counted transition into that state. Flagged when that state is an outcome
    (OUTCOME_STATES) and its time - created > deadline_ms (ms, strictly: exactly at the
    deadline is in time). `keys` (SQL of (tenant, handoff_id) rows): only those judged."""
    cohort = cohort_sql(
        db, window, tenant_param=tenant, extra=("deadline_ms", "last_seen"), within=keys
    )
    late = f"{_ns('last_seen')} - {_ns('created')} > toInt128(assumeNotNull(deadline_ms)) * 1000000"
    candidates = (
        f"deadline_ms IS NOT NULL AND {cs.has('tmask', cs.into_mask(OUTCOME_STATES))} AND {late}"
    )
    first = f"arrayFirst(k -> bitAnd(k, 255) IN {_idx(TERMINAL)}, ft.1)"
    reached = "arrayMin(arrayFilter((t, k) -> bitAnd(k, 255) = bitAnd(first_k, 255), ft.2, ft.1))"
    return f"""SELECT tenant, handoff_id, true AS deadline_overrun FROM (
    SELECT c.tenant AS tenant, c.handoff_id AS handoff_id, c.created AS created,
        c.deadline_ms AS deadline_ms, s.ft AS ft, {first} AS first_k
    FROM (SELECT tenant, handoff_id, created, deadline_ms FROM ({cohort}) WHERE {candidates}) AS c
    INNER JOIN (
        SELECT tenant, handoff_id, minMap(first_times) AS ft FROM {db}.{STATE_TABLE}
        WHERE (tenant, handoff_id) IN (
            SELECT tenant, handoff_id FROM ({cohort}) WHERE {candidates})
        GROUP BY tenant, handoff_id
    ) AS s USING (tenant, handoff_id)
)
WHERE bitAnd(first_k, 255) IN {_idx(OUTCOME_STATES)}
  AND {reached} - {_ns("created")} > toInt128(assumeNotNull(deadline_ms)) * 1000000"""


def budget_pass(
    db: str, window: Window, tenant: bool, keys: str | None = None, *, pending: bool = False
) -> str:
    """tool_budget_exceeded and ack_missing over the cohort (see the module doc).

    tool_budget_exceeded: the greatest `handoff.tool_calls` of a result row (prepare,
    commit, resolve_committed; counted or not: the calls were spent) > the envelope's
    `handoff.max_tool_calls` (greatest over the counted create rows).
    ack_missing: the envelope's `handoff.message.requires_ack` is true and it has
    `handoff.message.ttl_s`; the first counted accept or reject (from created) came more than
    ttl_s seconds after created, or none came and the window's clock (as_of) is more than
    ttl_s past created. Exactly at ttl_s is in time.
    `keys` (SQL of (tenant, handoff_id) rows): only those judged and read. The column
    `ack_open` (an ack asked for, none yet: whether it is missing depends on the clock)
    comes too; with `pending`, so do its rows, and ack_missing is set only for an ack that
    came late (what no clock changes)."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    results = _tuple(sorted(str(e) for e in RESULT_EVENTS))
    now = _ns(ts(window.clock()))
    seen = cohort_sql(db, window, tenant_param=tenant, extra=("first_seen", "last_seen"))
    cohort = cohort_sql(
        db, window, tenant_param=tenant, within="SELECT tenant, handoff_id FROM marked"
    )
    ack = " OR ".join(f"(event = '{e}' AND to_state = '{t}')" for e, t in ACK_EVENTS)
    tool, budget = f"attributes['{sc.TOOL_CALLS}']", f"attributes['{sc.MAX_TOOL_CALLS}']"
    wants, ttl = f"attributes['{sc.MESSAGE_REQUIRES_ACK}']", f"attributes['{sc.MESSAGE_TTL_S}']"
    if keys is None:
        bounds = f"WITH (SELECT (min(first_seen), max(last_seen)) FROM ({seen})) AS bounds,"
        where = f"time >= bounds.1 AND time <= bounds.2 {tw}"
    else:
        bounds, where = "WITH", f"(tenant, handoff_id) IN ({keys}) {tw}"
    late = "AND t_ack IS NOT NULL" if pending else ""
    return f"""{bounds}
marked AS (
    SELECT DISTINCT tenant, handoff_id FROM {db}.handoff_transitions
    PREWHERE audit_attrs
    WHERE {where}
      AND ((event IN {results} AND mapContains(attributes, '{sc.TOOL_CALLS}'))
           OR (event = 'create' AND {wants} = 'true'))
),
facts AS (
    SELECT tenant, handoff_id,
        max(if(event IN {results}, toInt64OrNull({tool}), NULL)) AS used,
        max(if({_IS_CREATE}, toInt64OrNull({budget}), NULL)) AS budget,
        max({_IS_CREATE} AND {wants} = 'true') AS wants_ack,
        max(if({_IS_CREATE}, toInt64OrNull({ttl}), NULL)) AS ttl_s,
        min(if(valid AND from_state = 'created' AND ({ack}), {_ns("time")}, NULL)) AS t_ack
    FROM {db}.handoff_transitions
    PREWHERE audit_attrs OR event IN ('create', {", ".join(f"'{e}'" for e, _t in ACK_EVENTS)})
    WHERE (tenant, handoff_id) IN marked
    GROUP BY tenant, handoff_id
)
SELECT tenant, handoff_id,
    coalesce(used > budget, false) AS tool_budget_exceeded,
    wants_ack AND ttl_s IS NOT NULL {late}
        AND coalesce(t_ack, {now}) - {_ns("created")} > toInt128(assumeNotNull(ttl_s)) * 1000000000
        AS ack_missing,
    wants_ack AND ttl_s IS NOT NULL AND t_ack IS NULL AS ack_open
FROM (SELECT tenant, handoff_id, created FROM ({cohort})) AS c
INNER JOIN facts USING (tenant, handoff_id)
WHERE tool_budget_exceeded OR ack_missing{" OR ack_open" if pending else ""}"""
