"""The handoffs of one task, for the explorer's per-task graph (SQL over the task index).

The fleet graph's per-pair numbers are analytics.funnel sliced by from_agent and to_agent;
this module only adds what the funnel has no dimension for: one task's handoffs with the
causation id their envelope named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pandas as pd

from analytics._sql import contract as cs
from analytics._sql.cohort import check_db
from analytics._sql.rows import POINT_LOOKUP
from collector import semconv as sc

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["TASK_HANDOFF_COLUMNS", "task_handoffs"]

TASK_HANDOFF_COLUMNS: Final = (
    "handoff_id",
    "from_agent",
    "to_agent",
    "mode",
    "created",
    "last_state",
    "causation_id",
)


def task_handoffs(
    client: Client,
    *,
    database: str | None = None,
    tenant: str,
    task_id: str,
    limit: int = 200,
) -> pd.DataFrame:
    """The handoffs of (tenant, task_id): columns TASK_HANDOFF_COLUMNS, created order (UTC;
    the first time seen when no create was stored), at most `limit` rows. causation_id is
    the create span's handoff.causation_id, "" when it named none. ValueError for an empty
    task_id or a limit below 1."""
    db = check_db(database)
    if not task_id:
        raise ValueError("task_id must be a non-empty string")
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    sql = f"""
SELECT s.handoff_id AS handoff_id, s.from_agent AS from_agent, s.to_agent AS to_agent,
    s.mode AS mode, s.created AS created, s.last_state AS last_state,
    c.causation_id AS causation_id
FROM (
    SELECT handoff_id, max(from_agent) AS from_agent, max(to_agent) AS to_agent,
        max(mode) AS mode, coalesce(min(created), min(first_seen)) AS created,
        {cs.last_state_expr("groupBitOr(tmask)")} AS last_state
    FROM {db}.handoff_summary
    WHERE tenant = {{t:String}} AND handoff_id IN (
        SELECT handoff_id FROM {db}.handoff_tasks
        WHERE tenant = {{t:String}} AND task_id = {{k:String}})
    GROUP BY handoff_id
) AS s
LEFT JOIN (
    SELECT handoff_id, any(attributes['{sc.CAUSATION_ID}']) AS causation_id
    FROM {db}.handoff_transitions
    WHERE tenant = {{t:String}} AND task_id = {{k:String}} AND event = 'create'
    GROUP BY handoff_id
) AS c ON c.handoff_id = s.handoff_id
ORDER BY created, handoff_id
LIMIT {int(limit)}
"""
    df = client.query_df(sql, parameters={"t": tenant, "k": task_id}, settings=POINT_LOOKUP)
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in TASK_HANDOFF_COLUMNS})
    df["created"] = pd.to_datetime(df["created"]).dt.tz_localize(None).dt.tz_localize("UTC")
    df["causation_id"] = df["causation_id"].fillna("").astype(str)
    return df[list(TASK_HANDOFF_COLUMNS)].reset_index(drop=True)
