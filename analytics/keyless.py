"""Keyless side-effecting handoffs per agent pair: of the writes a duplicate would apply twice
(a command, `handoff.message.kind=command`, or any handoff on the shared_queue topology),
how many the sender sent without an idempotency key, so no receiver can tell a resend from a
new request. The pairs with the largest share are where keyless_duplicate_write can happen.

`keyless_writes(client, window, *, database=None, tenant=None)` -> DataFrame, one row per
(from_agent, to_agent) with at least one side-effecting handoff in the window's cohort
(handoffs created in it): side_effecting (handoffs), keyless (handoffs), keyless_share
(keyless / side_effecting, a fraction 0..1), duplicates (handoffs flagged
keyless_duplicate_write). Worst share first, then the most keyless. Definitions:
docs/metrics.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._sql.anomalies import pass_sql
from analytics._sql.anomaly_state import IS_CREATE
from analytics._sql.cohort import Window, check_db, cohort_sql, settled_window, ts
from analytics._sql.inferred_policy import SIDE_EFFECT_KIND, SIDE_EFFECT_TOPOLOGY
from analytics.oracle.funnel import UNKNOWN_SLA_MS
from collector import semconv

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["KEYLESS_COLUMNS", "keyless_writes", "keyless_writes_sql"]

KEYLESS_COLUMNS: Final = (
    "from_agent",
    "to_agent",
    "side_effecting",
    "keyless",
    "keyless_share",
    "duplicates",
)


def keyless_writes_sql(db: str, window: Window, *, tenant: bool) -> str:
    """SQL of keyless_writes' rows (`{tenant:String}` a parameter when `tenant`). The cohort's
    summary rows give the pair, topology and key; the message kind is read from the
    window's create rows carrying a topology attribute only (PREWHERE on topology_attrs,
    sql/011), so no other row's map is read; duplicates come from the keyless pass."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    cohort = cohort_sql(
        db,
        window,
        tenant_param=tenant,
        extra=("from_agent", "to_agent", "topology", "idempotency_key"),
    )
    kinds = f"""SELECT tenant, handoff_id, max(attributes['{semconv.MESSAGE_KIND}']) AS kind
        FROM {db}.handoff_transitions
        PREWHERE event = 'create' AND topology_attrs
        WHERE {IS_CREATE} AND time >= {ts(window.start)} AND time < {ts(window.end)} {tw}
        GROUP BY tenant, handoff_id"""
    dup = pass_sql("keyless", db, window, tenant=tenant, sla_ms=UNKNOWN_SLA_MS)
    return f"""SELECT from_agent, to_agent, toInt64(count()) AS side_effecting,
    toInt64(countIf(idempotency_key = '')) AS keyless,
    keyless / side_effecting AS keyless_share,
    toInt64(countIf((tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({dup}))))
        AS duplicates
FROM (
    SELECT c.tenant AS tenant, c.handoff_id AS handoff_id, c.from_agent AS from_agent,
        c.to_agent AS to_agent, c.idempotency_key AS idempotency_key
    FROM (SELECT tenant, handoff_id, from_agent, to_agent, topology, idempotency_key
          FROM ({cohort})) AS c
    LEFT JOIN ({kinds}) AS k ON k.tenant = c.tenant AND k.handoff_id = c.handoff_id
    WHERE c.topology = '{SIDE_EFFECT_TOPOLOGY}' OR k.kind = '{SIDE_EFFECT_KIND}'
)
GROUP BY from_agent, to_agent
ORDER BY keyless_share DESC, keyless DESC, from_agent, to_agent"""


def keyless_writes(
    client: Client, window: Window, *, database: str | None = None, tenant: str | None = None
) -> pd.DataFrame:
    """The keyless share of side-effecting handoffs per (from_agent, to_agent) (module
    doc); an empty frame with KEYLESS_COLUMNS when the cohort has none. TypeError unless
    `window` is an analytics.Window; ValueError for a bad database name or setting."""
    if not isinstance(window, Window):
        raise TypeError(f"window must be an analytics.Window, got {type(window).__name__}")
    db = check_db(database)
    w = settled_window(client, db, window, tenant)
    params: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
    got = client.query(keyless_writes_sql(db, w, tenant=tenant is not None), parameters=params)
    df = pd.DataFrame(got.result_rows, columns=list(KEYLESS_COLUMNS))
    for c in ("side_effecting", "keyless", "duplicates"):
        df[c] = df[c].astype("int64")
    df["keyless_share"] = df["keyless_share"].astype("float64")
    return df
