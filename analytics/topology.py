"""Each topology's own view: queue lag and stalled consumers, agent-as-tool fan-out, unknown
envelope fields, and per-topology failure cards (SQL over handoff_transitions and
handoff_summary).

Every loader takes (client, window, *, database=None, tenant=None) and returns a pandas
DataFrame over the window's cohort (handoffs created in it); numbers in ms or handoffs;
percentiles are exact (an observed value), NaN without samples. Definitions of the anomaly
kinds the cards count: docs/metrics.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._sql import contract as cs
from analytics._sql.anomalies import KIND_PASS, pass_sql
from analytics._sql.cohort import Window, check_db, cohort_sql, settled_window
from analytics._sql.stall import ANSWERED_MASK
from analytics.oracle.funnel import UNKNOWN_SLA_MS
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
        "consumer_stalled",
    ),
    "federated_a2a": ("invalid_transition", "stale_agent_card", "card_skill_refused"),
}
LAG_COLUMNS: Final = (
    "consumer",
    "queue",
    "handoffs",
    "p50_ms",
    "p95_ms",
    "max_ms",
    "enqueued",
    "waiting",
    "stalled",
    "offsets_behind",
)
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


def _frame(
    rows: list[dict[str, Any]], columns: tuple[str, ...], ints: tuple[str, ...]
) -> pd.DataFrame:
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
    """Queue consumers' lag, one row per (consumer, queue = `handoff.queue.name`, "" when
    unnamed), sorted, over the cohort's shared-queue rows: from the consumer's `accept`
    (consumer = its actor) `handoffs` (cohort handoffs with a `queue.lag_ms`; a handoff's
    greatest lag counts), p50_ms, p95_ms, max_ms; from the producer's `create` (consumer =
    the envelope's to_agent, where it carries `queue.offset`) `enqueued` (handoffs),
    `waiting` (of those, not taken, refused or withdrawn: neither accepted or beyond, nor
    rejected, canceled or escalated; an expired one still counts) and `stalled` (of those,
    consumer_stalled); `offsets_behind` = the queue's head (the greatest `queue.offset` or
    `queue.head_offset` on the cohort's create and accept rows of that queue) minus the
    greatest offset the consumer accepted, or, when it accepted none, minus its least
    enqueued offset plus 1 (nothing of what was enqueued for it was taken); NaN without
    offsets. So a consumer that stopped shows: it has no lag (it never accepts), but
    waiting messages and offsets behind.

    The create and accept rows carrying a queue attribute are found first (PREWHERE on the
    typed topology_attrs column, sql/011, so no other row's map is read), and only their
    handoffs' summary rows are read for the cohort (no IN set of the whole cohort is built);
    `stalled` runs the consumer_stalled pass."""
    db = check_db(database)
    w = settled_window(client, db, _check_window(window), tenant)
    t = tenant is not None
    cohort = cohort_sql(
        db, w, tenant_param=t, extra=("to_agent",), within="SELECT tenant, handoff_id FROM qrows"
    )
    stalled = pass_sql("stall", db, w, tenant=t, sla_ms=UNKNOWN_SLA_MS)
    tw = "AND tenant = {tenant:String}" if t else ""

    def num(name: str) -> str:
        return f"toInt64OrNull(attributes['{name}'])"

    answered = cs.has("tmask", ANSWERED_MASK)
    sql = f"""
WITH qrows AS (
    SELECT tenant, handoff_id, event, CAST(actor, 'String') AS actor,
        attributes['{sc.QUEUE_NAME}'] AS queue, {num(sc.QUEUE_LAG_MS)} AS lag,
        {num(sc.QUEUE_OFFSET)} AS off, {num(sc.QUEUE_HEAD_OFFSET)} AS head
    FROM {db}.handoff_transitions
    PREWHERE event IN ('accept', 'create') AND topology_attrs
    WHERE (event = 'accept' OR {_IS_CREATE})
      AND (lag IS NOT NULL OR off IS NOT NULL OR head IS NOT NULL) {tw}
),
per AS (
    SELECT q.tenant AS tenant, q.handoff_id AS handoff_id,
        if(q.event = 'accept', q.actor, CAST(c.to_agent, 'String')) AS consumer, q.queue AS queue,
        maxIf(q.lag, q.event = 'accept') AS lag, maxIf(q.off, q.event = 'accept') AS consumed,
        maxIf(q.off, q.event = 'create') AS enq, max(greatest(coalesce(q.off, q.head),
        coalesce(q.head, q.off))) AS top, any(c.waiting) AS waiting
    FROM qrows AS q
    INNER JOIN (SELECT tenant, handoff_id, to_agent, NOT is_a AND NOT {answered} AS waiting
                FROM ({cohort})) AS c ON q.tenant = c.tenant AND q.handoff_id = c.handoff_id
    GROUP BY tenant, handoff_id, consumer, queue
)
SELECT consumer, queue, countIf(lag IS NOT NULL) AS handoffs,
    quantilesExactIf(0.5, 0.95)(assumeNotNull(lag), lag IS NOT NULL) AS q,
    maxIf(assumeNotNull(lag), lag IS NOT NULL) AS mx,
    countIf(enq IS NOT NULL) AS enqueued, countIf(enq IS NOT NULL AND waiting) AS waits,
    countIf(enq IS NOT NULL
            AND (tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({stalled}))) AS stalls,
    max(consumed) AS consumed, min(enq) AS first_enq, max(top) AS top
FROM per
GROUP BY consumer, queue
ORDER BY consumer, queue
"""
    res = client.query(sql, parameters=_params(tenant)).result_rows
    heads: dict[str, int] = {}  # queue -> its head over every consumer's rows
    for r in res:
        q, top = str(r[1]), r[-1]
        if top is not None:
            heads[q] = max(heads.get(q, top), top)
    rows = []
    for c, q, n, qs, mx, enq, waits, stalls, consumed, first_enq, _top in res:
        head = heads.get(q)
        base = consumed if consumed is not None else None if first_enq is None else first_enq - 1
        behind = math.nan if head is None or base is None else float(head - base)
        rows.append(
            {"consumer": c, "queue": q, "handoffs": int(n), "p50_ms": _q(qs, n, 0),
             "p95_ms": _q(qs, n, 1), "max_ms": float(mx) if n else math.nan,
             "enqueued": int(enq), "waiting": int(waits), "stalled": int(stalls),
             "offsets_behind": behind}
        )  # fmt: skip
    return _frame(rows, LAG_COLUMNS, ("handoffs", "enqueued", "waiting", "stalled"))


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
