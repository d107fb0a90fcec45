"""Anomalies of the cohort (DESIGN.md list), each a count of handoffs plus example ids.

Each kind is one SQL query returning the affected handoff ids; `count` is the number of
distinct handoffs flagged (for rejection_spike: the rejected handoffs of the spiking
(to_agent, capability) groups). Exact definitions and thresholds: docs/metrics.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics import _contract_sql as cs
from analytics._common import Window, check_db, cohort_sql, ts
from analytics.reference import UNKNOWN_SLA_MS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "ANOMALY_KINDS",
    "DESCRIPTIONS",
    "SPIKE_BASELINE_FACTOR",
    "SPIKE_MIN_RATE",
    "SPIKE_MIN_SETTLED",
    "anomalies",
    "anomaly_handoff_ids",
]

DESCRIPTIONS: Final = {
    "invalid_transition": "a transition not in the state table, flagged valid=false, a second "
    "move out of the same state, or any message after a terminal state",
    "duplicate_delivery": "the same transition (event, from, to) stored more than once",
    "idempotency_conflict": "the same idempotency key created with a different payload_hash",
    "stale_fence": "a commit whose fence token (or state version) is lower than one seen "
    "earlier for the same task",
    "committed_without_evidence": "reached committed/verified, but its first result carried no "
    "valid evidence (count >= 1 and valid = true)",
    "unknown_unresolved": "entered unknown and not resolved within the SLA (default 15 min)",
    "accepted_never_started": "still in accepted (never running, no unknown, no terminal state) "
    "past its deadline",
    "bounce": "a transfer handed straight back (A->B transfer, then B->A transfer in the task)",
    "rejection_spike": "rejection rate of one to_agent+capability far above its baseline "
    "(the 7 windows before)",
    "clock_skew": "a transition timestamped before the transition it must follow",
    "orphan_transition": "transitions (first seen in the window) of a handoff whose create was "
    "never seen",
    "implied_accept": "accepted or later reached without an accept transition",
}
ANOMALY_KINDS: Final = tuple(DESCRIPTIONS)

#: rejection_spike: a group spikes when both the window and the baseline have at least
#: SPIKE_MIN_SETTLED settled handoffs, the window's rejection rate is >= SPIKE_MIN_RATE and
#: >= SPIKE_BASELINE_FACTOR x baseline rate + 0.1. Baseline = the 7 window lengths before.
SPIKE_MIN_SETTLED: Final = 5
SPIKE_MIN_RATE: Final = 0.3
SPIKE_BASELINE_FACTOR: Final = 2.0
SPIKE_BASELINE_WINDOWS: Final = 7


def _counted_transitions(db: str, cohort: str) -> str:
    """Counted transitions (legal, valid) of the cohort's handoffs, one row per distinct
    transition with its earliest time."""
    return f"""
SELECT tenant, handoff_id, from_state, event, to_state, min(time) AS t,
    {cs.order_key_expr()} AS okey
FROM {db}.handoff_transitions
WHERE (tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({cohort}))
  AND ({cs.position_expr()}) > 0
GROUP BY tenant, handoff_id, from_state, event, to_state
"""


def _kind_sql(kind: str, db: str, window: Window, tenant: bool, sla_ms: int) -> str:
    cohort = cohort_sql(db, window, tenant_param=tenant)
    as_of = ts(window.clock())
    in_cohort = f"(tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({cohort}))"
    tw = "AND tenant = {tenant:String}" if tenant else ""
    now_ns = f"toUnixTimestamp64Nano({as_of})"
    if kind == "invalid_transition":
        return f"""SELECT handoff_id FROM ({cohort})
WHERE uncounted > 0 OR {cs.fork_condition()} OR {cs.after_terminal_condition()}"""
    if kind == "duplicate_delivery":
        return f"""SELECT DISTINCT handoff_id FROM {db}.handoff_transitions
WHERE {in_cohort}
GROUP BY tenant, handoff_id, event, from_state, to_state HAVING count() > 1"""
    if kind == "idempotency_conflict":
        return f"""SELECT DISTINCT handoff_id FROM {db}.handoff_transitions
WHERE event = 'create' AND idempotency_key != '' AND {in_cohort}
  AND (tenant, idempotency_key) IN (
    SELECT tenant, idempotency_key FROM {db}.handoff_transitions
    WHERE event = 'create' AND idempotency_key != '' AND payload_hash != '' {tw}
    GROUP BY tenant, idempotency_key HAVING uniqExact(payload_hash) > 1)"""
    if kind == "stale_fence":
        return f"""SELECT DISTINCT handoff_id FROM (
    SELECT tenant, handoff_id, event, fence_token, state_version,
        max(fence_token) OVER w AS prev_fence, max(state_version) OVER w AS prev_version
    FROM {db}.handoff_transitions
    WHERE (tenant, task_id) IN (SELECT tenant, task_id FROM ({cohort}))
    WINDOW w AS (PARTITION BY tenant, task_id ORDER BY time, span_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
WHERE event IN ('commit', 'resolve_committed') AND {in_cohort}
  AND (coalesce(fence_token < prev_fence, false) OR coalesce(state_version < prev_version, false))"""
    if kind == "committed_without_evidence":
        return f"SELECT handoff_id FROM ({cohort}) WHERE {cs.has('tmask', cs.COMMITTED_MASK)} AND NOT is_v"
    if kind == "unknown_unresolved":
        return f"""SELECT handoff_id FROM ({cohort}) WHERE is_unresolved
  AND {now_ns} - toUnixTimestamp64Nano(assumeNotNull(t_unknown_in)) > {int(sla_ms)} * 1000000"""
    if kind == "accepted_never_started":
        return f"""SELECT handoff_id FROM ({cohort})
WHERE is_a AND NOT {cs.has("tmask", cs.BEYOND_ACCEPTED_MASK)}
  AND {now_ns} - toUnixTimestamp64Nano(created) > deadline_eff * 1000000"""
    if kind == "implied_accept":
        return f"SELECT handoff_id FROM ({cohort}) WHERE is_a AND NOT {cs.has('tmask', cs.ACCEPT_EVENT_MASK)}"
    if kind == "orphan_transition":
        tw2 = "WHERE tenant = {tenant:String}" if tenant else ""
        return f"""SELECT handoff_id FROM {db}.handoff_summary {tw2}
GROUP BY tenant, handoff_id
HAVING min(created) IS NULL
   AND min(first_seen) >= {ts(window.start)} AND min(first_seen) < {ts(window.end)}"""
    if kind == "clock_skew":
        ct = _counted_transitions(db, cohort)
        return f"""SELECT DISTINCT x.handoff_id FROM ({ct}) AS x
INNER JOIN ({ct}) AS y
  ON x.tenant = y.tenant AND x.handoff_id = y.handoff_id AND x.to_state = y.from_state
WHERE y.to_state != x.from_state AND x.okey < y.okey AND y.t < x.t"""
    if kind == "bounce":
        return f"""SELECT handoff_id FROM (
    SELECT tenant, handoff_id, h_from, h_to,
        lagInFrame(h_from) OVER w AS prev_from, lagInFrame(h_to) OVER w AS prev_to,
        row_number() OVER w AS rn
    FROM (
        SELECT tenant, handoff_id, max(task_id) AS h_task, min(created) AS h_created,
            max(mode) AS h_mode, max(from_agent) AS h_from, max(to_agent) AS h_to
        FROM {db}.handoff_summary
        WHERE (tenant, task_id) IN (SELECT tenant, task_id FROM ({cohort}))
        GROUP BY tenant, handoff_id
        HAVING h_created IS NOT NULL AND h_mode = 'transfer'
    )
    WINDOW w AS (PARTITION BY tenant, h_task ORDER BY h_created, handoff_id
                 ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE rn > 1 AND h_from != '' AND prev_from = h_to AND prev_to = h_from
  AND {in_cohort}"""
    if kind == "rejection_spike":
        length = window.end - window.start
        base = Window(
            start=window.start - SPIKE_BASELINE_WINDOWS * length,
            end=window.start,
            as_of=window.clock(),
        )
        base_cohort = cohort_sql(db, base, tenant_param=tenant)
        rej = cs.has("tmask", cs.REJECTED_MASK)
        cap = "arrayJoin(if(empty(capabilities), [''], capabilities))"

        def rates(src: str) -> str:
            return f"""SELECT to_agent, {cap} AS capability, countIf(is_settled) AS n,
                countIf(is_settled AND {rej}) AS r
            FROM ({src}) GROUP BY to_agent, capability"""

        return f"""SELECT DISTINCT handoff_id FROM (
    SELECT handoff_id, to_agent, {cap} AS capability FROM ({cohort}) WHERE is_settled AND {rej}
) WHERE (to_agent, capability) IN (
    SELECT w.to_agent, w.capability FROM ({rates(cohort)}) AS w
    INNER JOIN ({rates(base_cohort)}) AS b ON w.to_agent = b.to_agent AND w.capability = b.capability
    WHERE w.n >= {SPIKE_MIN_SETTLED} AND b.n >= {SPIKE_MIN_SETTLED}
      AND w.r / w.n >= {SPIKE_MIN_RATE}
      AND w.r / w.n >= {SPIKE_BASELINE_FACTOR} * (b.r / b.n) + 0.1)"""
    raise ValueError(f"unknown anomaly kind {kind!r}; choose from {', '.join(ANOMALY_KINDS)}")


def _params(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant is not None else {}


def anomaly_handoff_ids(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    kind: str,
    tenant: str | None = None,
    limit: int = 1000,
    unknown_sla_ms: int = UNKNOWN_SLA_MS,
) -> list[str]:
    """Handoff ids flagged with `kind` in the window's cohort (sorted, at most `limit`).
    ValueError for an unknown kind."""
    db = check_db(database)
    inner = _kind_sql(kind, db, window, tenant is not None, unknown_sla_ms)
    sql = f"SELECT DISTINCT handoff_id FROM ({inner}) ORDER BY handoff_id LIMIT {int(limit)}"
    return [r[0] for r in client.query(sql, parameters=_params(tenant)).result_rows]


def anomalies(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    examples: int = 5,
    unknown_sla_ms: int = UNKNOWN_SLA_MS,
) -> pd.DataFrame:
    """One row per kind in ANOMALY_KINDS (zero counts included): kind, count (handoffs),
    examples (up to `examples` handoff ids, sorted), description."""
    db = check_db(database)
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    rows = []
    for kind in ANOMALY_KINDS:
        inner = _kind_sql(kind, db, window, tenant is not None, unknown_sla_ms)
        sql = f"""SELECT count() AS n, arraySlice(arraySort(groupArray(handoff_id)), 1, {int(examples)})
FROM (SELECT DISTINCT handoff_id FROM ({inner}))"""
        n, ex = client.query(sql, parameters=_params(tenant)).result_rows[0]
        rows.append({"kind": kind, "count": int(n), "examples": list(ex)[:examples],
                     "description": DESCRIPTIONS[kind]})  # fmt: skip
    return pd.DataFrame(rows, columns=["kind", "count", "examples", "description"])
