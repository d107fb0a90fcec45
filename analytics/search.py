"""Finding handoffs by what a user has at hand: a handoff id (or its start), a task id, an
idempotency key, or an agent (as sender or receiver). The Explorer's search box."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pandas as pd

from analytics._sql import contract as cs
from analytics._sql.cohort import check_db
from analytics.metrics import _LIST_COLUMNS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["MATCHED_BY", "search_handoffs"]

#: what a match can be by, in the order the `matched` column lists them
MATCHED_BY: Final = ("handoff id", "task id", "idempotency key", "from agent", "to agent")


def search_handoffs(
    client: Client, *, database: str | None = None, query: str, limit: int = 50
) -> pd.DataFrame:
    """Handoffs whose handoff_id, task_id, idempotency_key, from_agent or to_agent equals
    `query`, or whose handoff_id starts with it: analytics.find_handoffs' columns plus
    `matched` (what matched, MATCHED_BY names joined by ", "), newest first, at most `limit`
    rows (int >= 1). The query is a bound parameter, never SQL text. ValueError for an empty
    query or a bad limit."""
    db = check_db(database)
    q = (query or "").strip()
    if not q:
        raise ValueError("query must be a non-empty handoff id, task id, agent or idempotency key")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    sql = f"""
SELECT handoff_id, max(task_id) AS task_id, tenant, max(from_agent) AS from_agent,
    max(to_agent) AS to_agent, max(mode) AS mode, min(created) AS created,
    {cs.last_state_expr("groupBitOr(tmask)")} AS last_state
FROM {db}.handoff_summary
WHERE handoff_id IN (
    SELECT handoff_id FROM {db}.handoff_transitions
    WHERE handoff_id = {{q:String}} OR task_id = {{q:String}} OR idempotency_key = {{q:String}}
       OR startsWith(handoff_id, {{q:String}}))
   OR handoff_id IN (
    SELECT handoff_id FROM {db}.handoff_summary
    WHERE from_agent = {{q:String}} OR to_agent = {{q:String}})
GROUP BY tenant, handoff_id
ORDER BY created DESC, handoff_id
LIMIT {int(limit)}
"""
    df = client.query_df(sql, parameters={"q": q})
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in (*_LIST_COLUMNS, "matched")})
    df["created"] = pd.to_datetime(df["created"]).dt.tz_localize(None).dt.tz_localize("UTC")
    df = df[list(_LIST_COLUMNS)].reset_index(drop=True)
    # the idempotency key is on the create row only: read it for the matches (one point query)
    keys = _idempotency_keys(client, db, q, list(df["handoff_id"]))
    df["matched"] = [
        ", ".join(
            name
            for name, hit in zip(
                MATCHED_BY,
                (
                    h == q or h.startswith(q),
                    t == q,
                    h in keys,
                    f == q,
                    to == q,
                ),
                strict=True,
            )
            if hit
        )
        for h, t, f, to in zip(
            df["handoff_id"], df["task_id"], df["from_agent"], df["to_agent"], strict=True
        )
    ]
    return df


def _idempotency_keys(client: Client, db: str, q: str, ids: list[str]) -> set[str]:
    """The ids among `ids` with a row whose idempotency key is `q`."""
    res = client.query(
        f"""SELECT DISTINCT handoff_id FROM {db}.handoff_transitions
        WHERE handoff_id IN {{ids:Array(String)}} AND idempotency_key = {{q:String}}""",
        parameters={"ids": ids, "q": q},
    )
    return {str(h) for (h,) in res.result_rows}
