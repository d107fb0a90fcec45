"""Each topology's own view: queue lag, agent-as-tool fan-out, unknown envelope fields, and
per-topology failure cards (SQL over handoff_transitions and handoff_summary).

Every loader takes (client, window, *, database=None, tenant=None) and returns a pandas
DataFrame over the window's cohort (handoffs created in it); numbers in ms or handoffs;
percentiles are exact (an observed value), NaN without samples. Definitions of the anomaly
kinds the cards count: docs/metrics.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._anomaly_sql import KIND_PASS, pass_sql
from analytics._common import Window, check_db, cohort_sql, settled_window
from analytics.reference import UNKNOWN_SLA_MS
from collector import semconv as sc
from collector.semconv import TOPOLOGIES

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "CARD_COLUMNS",
    "FAN_OUT_COLUMNS",
    "LAG_COLUMNS",
    "TOPOLOGY_CARD_KINDS",
    "UNKNOWN_FIELD_COLUMNS",
    "queue_lag",
    "task_fan_out",
    "topology_cards",
    "unknown_fields",
]

#: topology label -> the anomaly kinds that define its failures (messages after a terminal
#: state count under invalid_transition; an orphan has no create, hence no topology)
TOPOLOGY_CARD_KINDS: Final = {
    "in_process": ("bounce", "unfiltered_sensitive_history"),
    "agent_as_tool": ("partial_result_committed", "fan_out_all"),
    "shared_queue": (
        "duplicate_delivery",
        "idempotency_conflict",
        "duplicate_execution",
        "consumer_lag",
    ),
    "federated_a2a": ("invalid_transition", "stale_agent_card"),
}
LAG_COLUMNS: Final = ("consumer", "queue", "handoffs", "p50_ms", "p95_ms", "max_ms")
FAN_OUT_COLUMNS: Final = (
    "orchestrator",
    "tasks",
    "experts_p50",
    "experts_p95",
    "attempts_p50",
    "attempts_p95",
)
UNKNOWN_FIELD_COLUMNS: Final = ("consumer", "schema_version", "field", "handoffs")
CARD_COLUMNS: Final = ("topology", "handoffs", "kind", "flagged", "rate")
_IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"
if set(TOPOLOGY_CARD_KINDS) != set(TOPOLOGIES):  # pragma: no cover
    raise ImportError("analytics.topology: TOPOLOGY_CARD_KINDS does not cover TOPOLOGIES")


def _params(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant is not None else {}


def _ids(cohort: str) -> str:
    return f"(tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({cohort}))"


def _check_window(window: Any) -> Window:
    if not isinstance(window, Window):
        raise TypeError(f"window must be an analytics.Window, got {type(window).__name__}")
    return window


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...], ints: tuple[str, ...]):
    df = pd.DataFrame(rows, columns=list(columns))
    for c in columns:
        if c in ints:
            df[c] = df[c].astype("int64")
        elif c not in ("consumer", "queue", "orchestrator", "schema_version", "field"):
            df[c] = df[c].astype("float64")
        else:
            df[c] = df[c].astype("object")
    return df


def _q(values: list[float], n: int, i: int) -> float:
    return float(values[i]) if n else math.nan


def queue_lag(
    client: Client, window: Window, *, database: str | None = None, tenant: str | None = None
) -> pd.DataFrame:
    """Queue consumers' lag (`handoff.queue.lag_ms` on accept), one row per (consumer =
    the accept's actor, queue = `handoff.queue.name`, "" when unnamed), sorted: handoffs
    (cohort handoffs with a lag; a handoff's greatest lag counts), p50_ms, p95_ms, max_ms.

    The accept rows carrying a lag are found first (PREWHERE on the typed topology_attrs
    column, sql/011, so no other row's map is read), and only their handoffs' summary rows
    are read for the cohort (no IN set of the whole cohort is built)."""
    db = check_db(database)
    w = settled_window(client, db, _check_window(window), tenant)
    cohort = cohort_sql(
        db,
        w,
        tenant_param=tenant is not None,
        extra=(),
        within="SELECT tenant, handoff_id FROM lagged",
    )
    tw = "AND tenant = {tenant:String}" if tenant is not None else ""
    lag = f"toInt64OrNull(attributes['{sc.QUEUE_LAG_MS}'])"
    sql = f"""
WITH lagged AS (
    SELECT tenant, handoff_id, CAST(actor, 'String') AS consumer,
        attributes['{sc.QUEUE_NAME}'] AS queue, max(assumeNotNull({lag})) AS lag
    FROM {db}.handoff_transitions
    PREWHERE event = 'accept' AND topology_attrs
    WHERE {lag} IS NOT NULL {tw}
    GROUP BY tenant, handoff_id, consumer, queue
)
SELECT consumer, queue, count() AS handoffs, quantilesExact(0.5, 0.95)(lag) AS q, max(lag) AS mx
FROM lagged
INNER JOIN (SELECT tenant, handoff_id FROM ({cohort})) AS c USING (tenant, handoff_id)
GROUP BY consumer, queue
ORDER BY consumer, queue
"""
    res = client.query(sql, parameters=_params(tenant)).result_rows
    rows = [
        {"consumer": c, "queue": q, "handoffs": int(n), "p50_ms": _q(qs, n, 0),
         "p95_ms": _q(qs, n, 1), "max_ms": int(mx)}
        for c, q, n, qs, mx in res
    ]  # fmt: skip
    return _frame(rows, LAG_COLUMNS, ("handoffs", "max_ms"))


def task_fan_out(
    client: Client, window: Window, *, database: str | None = None, tenant: str | None = None
) -> pd.DataFrame:
    """Agent-as-tool fan-out per orchestrator (the from_agent of the cohort's agent_as_tool
    handoffs), sorted: tasks, experts per task (distinct to_agents) p50/p95, attempts per
    task (handoffs) p50/p95."""
    db = check_db(database)
    w = settled_window(client, db, _check_window(window), tenant)
    cohort = cohort_sql(
        db,
        w,
        tenant_param=tenant is not None,
        extra=("task_id", "from_agent", "to_agent", "topology"),
    )
    sql = f"""
SELECT orchestrator, count() AS tasks, quantilesExact(0.5, 0.95)(experts) AS qe,
    quantilesExact(0.5, 0.95)(attempts) AS qa
FROM (
    SELECT tenant, CAST(from_agent, 'String') AS orchestrator, task_id,
        uniqExact(to_agent) AS experts, count() AS attempts
    FROM ({cohort})
    WHERE topology = 'agent_as_tool' AND to_agent != ''
    GROUP BY tenant, orchestrator, task_id
)
GROUP BY orchestrator
ORDER BY orchestrator
"""
    res = client.query(sql, parameters=_params(tenant)).result_rows
    rows = [
        {"orchestrator": o, "tasks": int(n), "experts_p50": _q(qe, n, 0),
         "experts_p95": _q(qe, n, 1), "attempts_p50": _q(qa, n, 0), "attempts_p95": _q(qa, n, 1)}
        for o, n, qe, qa in res
    ]  # fmt: skip
    return _frame(rows, FAN_OUT_COLUMNS, ("tasks",))


def unknown_fields(
    client: Client, window: Window, *, database: str | None = None, tenant: str | None = None
) -> pd.DataFrame:
    """Envelope fields consumers did not know (`handoff.envelope.unknown_fields` on accept
    or reject), one row per (consumer = that row's actor, schema_version = the create's
    `handoff.schema_version`, "" when absent, field as sent), sorted: handoffs (distinct
    cohort handoffs)."""
    db = check_db(database)
    w = settled_window(client, db, _check_window(window), tenant)
    cohort = cohort_sql(db, w, tenant_param=tenant is not None, extra=())
    uf = f"JSONExtract(attributes['{sc.ENVELOPE_UNKNOWN_FIELDS}'], 'Array(String)')"
    sql = f"""
SELECT consumer, schema_version, field, uniqExact(tenant, handoff_id) AS handoffs
FROM (
    SELECT tenant, handoff_id, sv AS schema_version, arrayJoin(pairs) AS p,
        p.1 AS consumer, p.2 AS field
    FROM (
        SELECT tenant, handoff_id,
            maxIf(attributes['{sc.SCHEMA_VERSION}'], {_IS_CREATE}) AS sv,
            arrayDistinct(arrayFlatten(groupArrayIf(
                arrayMap(f -> (CAST(actor, 'String'), f), {uf}),
                event IN ('accept', 'reject')))) AS pairs
        FROM {db}.handoff_transitions
        PREWHERE (event IN ('accept', 'reject')
                  AND has(attributes.keys, '{sc.ENVELOPE_UNKNOWN_FIELDS}'))
              OR (event = 'create' AND has(attributes.keys, '{sc.SCHEMA_VERSION}'))
        WHERE {_ids(cohort)}
        GROUP BY tenant, handoff_id
    )
)
WHERE field != ''
GROUP BY consumer, schema_version, field
ORDER BY consumer, schema_version, field
"""
    res = client.query(sql, parameters=_params(tenant)).result_rows
    rows = [
        {"consumer": c, "schema_version": v, "field": f, "handoffs": int(n)} for c, v, f, n in res
    ]
    return _frame(rows, UNKNOWN_FIELD_COLUMNS, ("handoffs",))


def topology_cards(
    client: Client, window: Window, *, database: str | None = None, tenant: str | None = None
) -> pd.DataFrame:
    """One row per (topology, kind) of TOPOLOGY_CARD_KINDS, in that order: handoffs (the
    cohort's handoffs of that topology), flagged (those the kind flags), rate = flagged /
    handoffs (NaN without handoffs). One query: the cohort read once, the anomaly passes the
    kinds need reduced to their flagged handoffs (few), grouped to one row per handoff
    (tenant and id, as anomalies() counts them) and joined to it."""
    db = check_db(database)
    w = settled_window(client, db, _check_window(window), tenant)
    params = _params(tenant)
    topo_cohort = cohort_sql(db, w, tenant_param=tenant is not None, extra=("topology",))
    wanted: dict[str, set[str]] = {}
    for card in TOPOLOGY_CARD_KINDS.values():
        for k in card:
            wanted.setdefault(KIND_PASS[k], set()).add(k)
    # each pass reduced to its flagged rows (few), as (tenant, handoff_id, kind) rows, then
    # grouped to one row per handoff: the one built side the cohort streams by
    reduced: list[str] = []
    found_kinds: list[str] = []
    for name, pass_kinds in sorted(wanted.items()):
        inner = pass_sql(name, db, w, tenant=tenant is not None, sla_ms=UNKNOWN_SLA_MS)
        order = sorted(pass_kinds)
        names = ", ".join(f"if({k}, '{k}', '')" for k in order)
        reduced.append(
            f"SELECT tenant, handoff_id, arrayJoin([{names}]) AS kind FROM ({inner})"
            f" WHERE {' OR '.join(order)}"
        )
        found_kinds += order
    counts = ", ".join(f"countIf(has(f.kinds, '{k}'))" for k in found_kinds)
    union = "\n    UNION ALL\n    ".join(reduced)
    sql = f"""
SELECT c.topology, count(), {counts}
FROM (SELECT tenant, handoff_id, topology FROM ({topo_cohort})) AS c
LEFT JOIN (
    SELECT tenant, handoff_id, groupUniqArrayIf(kind, kind != '') AS kinds FROM (
    {union})
    GROUP BY tenant, handoff_id
) AS f ON c.tenant = f.tenant AND c.handoff_id = f.handoff_id
GROUP BY c.topology
SETTINGS join_use_nulls = 0"""
    sizes: dict[str, int] = {}
    flagged: dict[tuple[str, str], int] = {}
    for topo, n, *found in client.query(sql, parameters=params).result_rows:
        sizes[str(topo)] = int(n)
        for k, f in zip(found_kinds, found, strict=True):
            flagged[(str(topo), k)] = int(f)
    rows = []
    for topo, kinds in TOPOLOGY_CARD_KINDS.items():
        n = sizes.get(topo, 0)
        for k in kinds:
            f = flagged.get((topo, k), 0)
            rows.append(
                {"topology": topo, "handoffs": n, "kind": k, "flagged": f,
                 "rate": f / n if n else math.nan}
            )  # fmt: skip
    df = pd.DataFrame(rows, columns=list(CARD_COLUMNS))
    for c in ("handoffs", "flagged"):
        df[c] = df[c].astype("int64")
    df["rate"] = df["rate"].astype("float64")
    return df
