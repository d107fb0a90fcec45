"""SQL of the retry link a sender did not declare: attempt B (no `handoff.retry_of`) of the
same task, from_agent, to_agent and objective hash (`handoff.objective.hash` of the create) as
an earlier attempt A. The retry pass (analytics._sql.state_passes.retry_sql) adds the
blind retries so linked; analytics._sql.inferred's refusal pass reads the same envelope
columns. The oracle: analytics.oracle.inferred (inferred_link).

Cost: the objective hash lives only in the create row's attribute map, so the candidates come
first from cheap columns (handoff_summary's unknown entry, its task, agents and created time;
handoff_tasks by primary key), the pairs are formed per (task, from_agent, to_agent) group
in memory, and only the few paired handoffs' create rows are read, by primary key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from analytics._sql.anomaly_state import IS_CREATE
from collector import semconv

__all__ = ["create_envelope_sql", "inferred_retries_sql", "rows_of"]

#: SQL of the create attributes the link reads (names from collector.semconv: no injection)
OBJECTIVE_HASH: Final = f"attributes['{semconv.OBJECTIVE_HASH}']"
RETRY_OF: Final = f"attributes['{semconv.RETRY_OF}']"


def _tenant_and(tenant: bool) -> str:
    return "AND tenant = {tenant:String}" if tenant else ""


def rows_of(array: str, *fields: int) -> str:
    """SQL of (tenant, handoff_id) rows from a constant array of tuples: the fields at the
    1-based positions `fields` (tenant first)."""
    cols = ", ".join(f"x.{i}" for i in fields)
    return f"SELECT {cols} FROM (SELECT arrayJoin({array}) AS x)"


def create_envelope_sql(db: str, keys: str) -> str:
    """tenant, handoff_id, oh (objective hash), rof (retry_of): the greatest over the counted
    create rows of the handoffs of `keys` (SQL of (tenant, handoff_id) rows), read by primary
    key; '' when absent. A handoff without a counted create has no row."""
    return f"""SELECT tenant, handoff_id, max({OBJECTIVE_HASH}) AS oh, max({RETRY_OF}) AS rof
    FROM {db}.handoff_transitions
    PREWHERE event = 'create'
    WHERE {IS_CREATE} AND (tenant, handoff_id) IN ({keys})
    GROUP BY tenant, handoff_id"""


def inferred_retries_sql(
    db: str, tenant: bool, subject: Callable[[str], str], scope: str | None = None
) -> str:
    """tenant, handoff_id (B), created, retried (A): the blind retries linked by inference.

    B is a subject (`subject(col)`: SQL over tenant, handoff_id and the created column `col`)
    with no retry_of; A another handoff of its tenant with the same task (non-empty),
    from_agent, to_agent and objective hash (non-empty), which was unknown when B was
    created: its first counted entry into unknown before B's creation, its first exit after
    it (or none). One row per pair.

    Candidates: without `scope`, the handoffs of the tasks of every handoff that entered
    unknown (handoff_summary, handoff_tasks by primary key); with `scope` (SQL of
    (tenant, handoff_id) rows holding every subject: the settle's few handoffs), the
    handoffs of the scope's tasks. They are grouped by (tenant, task, from_agent,
    to_agent); only groups with a subject and an unknown entry are paired, and only the
    paired handoffs' create rows are read."""
    tw = _tenant_and(tenant)
    if scope is None:
        tasks = f"""SELECT tenant, task_id FROM {db}.handoff_summary
            WHERE t_unknown_in IS NOT NULL AND task_id != '' {tw}"""
    else:
        tasks = f"""SELECT tenant, task_id FROM {db}.handoff_summary
            WHERE task_id != '' AND (tenant, handoff_id) IN ({scope})"""
    handoffs = f"""SELECT tenant, handoff_id, max(task_id) AS task, max(from_agent) AS src,
            max(to_agent) AS dst, min(created) AS h_created, min(t_unknown_in) AS t_in,
            min(t_unknown_out) AS t_out, {subject("min(created)")} AS subj
        FROM {db}.handoff_summary
        WHERE (tenant, handoff_id) IN (
            SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN ({tasks}))
        GROUP BY tenant, handoff_id"""
    blind = "a.3 IS NOT NULL AND a.3 < b.2 AND (a.4 IS NULL OR a.4 > b.2)"
    pairs = f"""SELECT tenant, b.1 AS b_id, b.2 AS created, a.1 AS a_id FROM (
        SELECT tenant, groupArray((handoff_id, h_created, t_in, t_out, subj)) AS hs
        FROM ({handoffs})
        WHERE task != ''
        GROUP BY tenant, task, src, dst
        HAVING count() > 1 AND countIf(t_in IS NOT NULL) > 0 AND countIf(subj) > 0
    )
    ARRAY JOIN hs AS b
    ARRAY JOIN hs AS a
    WHERE b.5 AND a.1 != b.1 AND {blind}"""
    keys = f"{rows_of('inf_pairs', 1, 2)} UNION ALL {rows_of('inf_pairs', 1, 4)}"
    env = create_envelope_sql(db, keys)
    found_b = "arrayFirst(e -> e.1 = p.1 AND e.2 = p.2, inf_env)"
    found_a = "arrayFirst(e -> e.1 = p.1 AND e.2 = p.4, inf_env)"
    return f"""WITH (SELECT groupArray((tenant, b_id, created, a_id)) FROM ({pairs})) AS inf_pairs,
    (SELECT groupArray((tenant, handoff_id, oh, rof)) FROM ({env})) AS inf_env
SELECT p.1 AS tenant, p.2 AS handoff_id, p.3 AS created, p.4 AS retried
FROM (SELECT arrayJoin(inf_pairs) AS p, {found_b} AS eb, {found_a} AS ea)
WHERE eb.4 = '' AND eb.3 != '' AND eb.3 = ea.3"""
