"""The handoff funnel and its companions, computed in SQL over handoff_summary (sql/003).

Contract: docs/design.md "Metric contract"; decisions where it is silent:
docs/metrics.md. Every loader takes a clickhouse-connect `client` and keyword-only
arguments; rates with an empty denominator are NaN (shown "—"), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._sql import contract as cs
from analytics._sql.cohort import (
    DIM_COLUMNS,
    DIMENSIONS,
    Window,
    bucket_expr,
    check_db,
    check_dims,
    cohort_sql,
    dim_expr,
    settled_window,
    ts,
)
from analytics.rollup import (
    COUNT_COLUMNS,
    OUTCOME_COLUMNS,
    OUTCOMES,
    RATE_COLUMNS,
    RATES,
    add_rates,
    outcomes,
    rate,
    rollup,
)
from analytics.stages import FUNNEL

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "COUNT_COLUMNS",
    "OUTCOMES",
    "OUTCOME_COLUMNS",
    "RATES",
    "RATE_COLUMNS",
    "STAGES",
    "add_rates",
    "find_handoffs",
    "funnel",
    "funnel_windows",
    "handoffs_behind",
    "latencies",
    "outcomes",
    "rate",
    "task_stats",
    "tenants",
]

#: outcome -> cohort-row condition: the bit tests of the state the handoff already keeps
#: (tmask), so the outcomes cost the funnel query a few bit operations, not a query each
_OUTCOME_CONDITIONS: Final = {
    **{s: cs.has("tmask", cs.into_mask({s})) for s in OUTCOMES[:5]},
    "unknown_open": "is_unresolved",
    "unknown_resolved": "is_unk AND NOT is_unresolved",
}

#: the funnel's count columns over cohort rows: the stages (analytics.stages), the outcomes
_COUNTS_SQL: Final = ",\n    ".join(
    [
        *(f"countIf({s.condition}) AS {s.name}" for s in FUNNEL),
        *(f"countIf({_OUTCOME_CONDITIONS[o]}) AS outcome_{o}" for o in OUTCOMES),
    ]
)

#: handoffs_behind's names of two funnel counts; every other stage keeps its column's name
_BEHIND_NAMES: Final = {"volume": "all", "unresolved_now": "unresolved"}
#: handoffs_behind stages -> SQL condition over the cohort flags (see analytics._sql.cohort): the
#: funnel's stages, the handoffs each step lost, disputed evidence, the outcomes
STAGES: Final = {
    **{_BEHIND_NAMES.get(s.name, s.name): s.condition for s in FUNNEL},
    "not_accepted": "is_settled AND NOT is_a",
    "not_executed": "is_settled AND is_a AND NOT is_e",
    "not_evidenced": "is_settled AND is_e AND NOT is_v",
    "evidence_disputed": "is_settled AND is_v_claimed AND NOT is_v",
    "not_committed": "is_settled AND is_v AND NOT is_k",
    **{f"outcome_{o}": c for o, c in _OUTCOME_CONDITIONS.items()},
}

_LIST_COLUMNS: Final = (
    "handoff_id",
    "task_id",
    "tenant",
    "from_agent",
    "to_agent",
    "mode",
    "created",
    "last_state",
)


_LAT_COLUMNS: Final = (
    "t_accepted",
    "t_running",
    "t_result",
    "t_committed",
    "t_unknown_in",
    "t_unknown_out",
)


def _dim_columns(by: tuple[str, ...]) -> list[str]:
    return [c for d in by if d in DIM_COLUMNS for c in DIM_COLUMNS[d]]


def _params(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant is not None else {}


def _group_select(
    by: tuple[str, ...], bucket: str | None
) -> tuple[list[str], list[str], list[str]]:
    """(select expressions, GROUP BY keys, output key columns). `pair` groups by the two
    agent columns and concatenates once per group, not once per handoff."""
    sel, group, keys = [], [], list(by)
    for d in by:
        if d == "pair":
            sel.append(f"{dim_expr(d)} AS pair")
            group += [c for c in ("from_agent", "to_agent") if c not in group]
        else:
            sel.append(f"{dim_expr(d)} AS {d}")
            if d not in group:
                group.append(d)
    b = bucket_expr(bucket)
    if b:
        sel.append(f"{b} AS bucket")
        group.append("bucket")
        keys.append("bucket")
    return sel, group, keys


def _group_clause(group: list[str], keys: list[str]) -> str:
    return f"GROUP BY {', '.join(group)} ORDER BY {', '.join(keys)}" if keys else ""


def funnel(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    by: str | Iterable[str] = (),
    tenant: str | None = None,
    bucket: str | None = None,
) -> pd.DataFrame:
    """The funnel of the cohort created in `window`: one row per group (one row when by=()).

    Columns: [*by, "bucket"] + counts (settled, in_flight, accepted, executed,
    evidence_claimed (the first result marked valid by the emitter), evidenced (and the
    envelope's evidence checks pass: docs/metrics.md), committed, verified, unknown,
    escalated, unresolved_now, volume, and the outcomes
    outcome_{rejected,expired,failed,canceled,escalated,unknown_open,unknown_resolved};
    handoffs) + rates
    (p_accept, p_execute, p_evidence, p_evidence_claimed, p_commit, p_e2e, p_verify, unknown_rate,
    escalation_rate; fractions 0..1,
    NaN when undefined). `by` ⊆ DIMENSIONS; bucket None | "hour" | "day" (of created time,
    UTC). Raises ValueError for an unknown dimension or bucket.
    """
    db = check_db(database)
    by = check_dims(by)
    window = settled_window(client, db, window, tenant)
    sel, group_keys, keys = _group_select(by, bucket)
    group = _group_clause(group_keys, keys)
    sql = f"""
SELECT {"".join(s + ", " for s in sel)}
    {_COUNTS_SQL}
FROM ({cohort_sql(db, window, tenant_param=tenant is not None, extra=_dim_columns(by))})
{group}
"""
    df = client.query_df(sql, parameters=_params(tenant))
    if df.empty and not keys:
        df = pd.DataFrame([dict.fromkeys(COUNT_COLUMNS, 0)])
    elif df.empty:  # the client returns no columns for an empty result: shape it
        df = _empty(keys, COUNT_COLUMNS)
    return _with_rates(df, keys)


def funnel_windows(
    client: Client,
    *,
    database: str | None = None,
    as_of: datetime,
    lengths: Iterable[timedelta],
    by: str | Iterable[str] = (),
    tenant: str | None = None,
) -> dict[timedelta, pd.DataFrame]:
    """funnel(window=[as_of - length, as_of) with clock as_of, by, tenant) for each length,
    from one query: the longest window's cohort, each handoff counted in the shortest
    window holding it (its ring), and each window the sum of the rings inside it (counts
    are sums over handoffs, and the settle rule's clock is as_of for every window).
    Columns as funnel's; ValueError for a length <= 0 or an unknown dimension."""
    db = check_db(database)
    by = check_dims(by)
    if "capability" in by:
        raise ValueError("funnel_windows: capability puts a handoff in several rows; use funnel")
    rings = sorted(set(lengths))
    if not rings or rings[0] <= timedelta(0):
        raise ValueError(f"lengths must be > 0, got {sorted(rings)!r}")
    sel, group_keys, keys = _group_select(by, None)
    starts = [ts(as_of - r) for r in rings]
    ring = "multiIf(" + "".join(f"created >= {t}, {i}, " for i, t in enumerate(starts)) + "-1)"
    widest = settled_window(
        client, db, Window(start=as_of - rings[-1], end=as_of, as_of=as_of), tenant
    )
    cohort = cohort_sql(db, widest, tenant_param=tenant is not None, extra=_dim_columns(by))
    sql = f"""
SELECT {"".join(s + ", " for s in sel)} {ring} AS ring,
    {_COUNTS_SQL}
FROM ({cohort})
GROUP BY {", ".join([*group_keys, "ring"])}
"""
    split = client.query_df(sql, parameters=_params(tenant))
    return {
        length: rollup(split[split["ring"] <= i] if len(split) else split, tuple(keys))
        for i, length in enumerate(rings)
    }


def _empty(keys: list[str], columns: Iterable[str]) -> pd.DataFrame:
    cols: dict[str, pd.Series] = {
        k: pd.Series(dtype="datetime64[ns, UTC]" if k == "bucket" else "object") for k in keys
    }
    cols.update({c: pd.Series(dtype="int64") for c in columns})
    return pd.DataFrame(cols)


def _with_rates(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    for c in COUNT_COLUMNS:
        df[c] = df[c].astype("int64") if len(df) else pd.Series(dtype="int64")

    add_rates(df)
    if "bucket" in df and len(df):
        df["bucket"] = pd.to_datetime(df["bucket"]).dt.tz_localize(None).dt.tz_localize("UTC")
    return df[[*keys, *COUNT_COLUMNS, *RATE_COLUMNS]].reset_index(drop=True)


def latencies(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    by: str | Iterable[str] = (),
    tenant: str | None = None,
) -> pd.DataFrame:
    """Latency percentiles (milliseconds) of the cohort, per group.

    Columns [*by] + {accept,result,commit,resolve}_{p50,p95,p99}_ms and *_n (samples):
    accept = created→accepted, result = running→first result, commit = created→committed,
    resolve = entered unknown→left unknown. Only handoffs with both times count; a negative
    difference (clock skew, reported as an anomaly) is left out. NaN without samples.
    """
    db = check_db(database)
    by = check_dims(by)
    window = settled_window(client, db, window, tenant)
    sel, group_keys, keys = _group_select(by, None)
    pairs = {
        "accept": ("created", "t_accepted"),
        "result": ("t_running", "t_result"),
        "commit": ("created", "t_committed"),
        "resolve": ("t_unknown_in", "t_unknown_out"),
    }
    parts = []
    for name, (a, b) in pairs.items():
        d = f"(toUnixTimestamp64Nano({b}) - toUnixTimestamp64Nano({a})) / 1e6"
        cond = f"{a} IS NOT NULL AND {b} IS NOT NULL AND {d} >= 0"
        parts.append(f"quantilesExactIf(0.5, 0.95, 0.99)(assumeNotNull({d}), {cond}) AS q_{name}")
        parts.append(f"countIf({cond}) AS {name}_n")
    group = _group_clause(group_keys, keys)
    sql = f"""
SELECT {"".join(s + ", " for s in sel)} {", ".join(parts)}
FROM ({cohort_sql(db, window, tenant_param=tenant is not None, extra=[*_dim_columns(by), *_LAT_COLUMNS])})
{group}
"""
    raw = client.query_df(sql, parameters=_params(tenant))
    if keys and raw.empty:
        cols = [f"{n}_{p}_ms" for n in pairs for p in ("p50", "p95", "p99")] + [
            f"{n}_n" for n in pairs
        ]
        out = _empty(keys, ())
        for c in cols:
            out[c] = pd.Series(dtype="int64" if c.endswith("_n") else "float64")
        return out
    out = raw[keys].copy() if keys else pd.DataFrame(index=range(max(len(raw), 1)))
    for name in pairs:
        n = raw[f"{name}_n"].astype("int64") if len(raw) else pd.Series([0])
        q = raw[f"q_{name}"] if len(raw) else pd.Series([[]])
        for i, p in enumerate(("p50", "p95", "p99")):
            out[f"{name}_{p}_ms"] = [
                float(v[i]) if cnt else math.nan for v, cnt in zip(q, n, strict=True)
            ]
        out[f"{name}_n"] = list(n)
    return out.reset_index(drop=True)


def tenants(client: Client, *, database: str | None = None, window: Window) -> list[str]:
    """Tenants with a handoff created in `window`, sorted: one read of handoff_summary's
    tenant and created columns (no merge; a tenant whose only create row in the window
    repeats an earlier create of the same handoff is listed too, with an empty funnel)."""
    db = check_db(database)
    sql = f"""SELECT DISTINCT tenant FROM {db}.handoff_summary
WHERE created IS NOT NULL AND created >= {ts(window.start)} AND created < {ts(window.end)}
ORDER BY tenant"""
    return [str(r[0]) for r in client.query(sql).result_rows]


def task_stats(
    client: Client, *, database: str | None = None, window: Window, tenant: str | None = None
) -> dict[str, float | int]:
    """Task level over the cohort: tasks, tasks_committed (≥1 handoff committed with evidence,
    i.e. K), task_success_rate (NaN without tasks), attempts_per_task (handoffs per task)."""
    db = check_db(database)
    window = settled_window(client, db, window, tenant)
    sql = f"""
SELECT count() AS tasks, countIf(ok) AS tasks_committed, sum(n) AS handoffs
FROM (
    SELECT tenant, task_id, max(is_k) AS ok, count() AS n
    FROM ({cohort_sql(db, window, tenant_param=tenant is not None, extra=["task_id"])})
    GROUP BY tenant, task_id
)
"""
    tasks, committed, handoffs = client.query(sql, parameters=_params(tenant)).result_rows[0]
    return {
        "tasks": int(tasks),
        "tasks_committed": int(committed),
        "task_success_rate": rate(committed, tasks),
        "attempts_per_task": rate(handoffs, tasks),
    }


def _filters_sql(filters: dict[str, str] | None, params: dict[str, Any]) -> list[str]:
    conds = []
    for i, (dim, value) in enumerate((filters or {}).items()):
        if dim not in DIMENSIONS:
            raise ValueError(
                f"unknown filter dimension {dim!r}; choose from {', '.join(DIMENSIONS)}"
            )
        key = f"f{i}"
        params[key] = str(value)
        if dim == "capability":
            conds.append(
                f"(has(capabilities, {{{key}:String}}) OR (empty(capabilities) AND {{{key}:String}} = ''))"
            )
        else:
            conds.append(f"{dim_expr(dim)} = {{{key}:String}}")
    return conds


def handoffs_behind(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    stage: str = "settled",
    tenant: str | None = None,
    filters: dict[str, str] | None = None,
    anomaly: str | None = None,
    limit: int = 200,
) -> pd.DataFrame:
    """The cohort handoffs behind one number: columns handoff_id, task_id, tenant, from_agent,
    to_agent, mode, created (UTC), last_state; newest first, at most `limit` rows.

    stage ∈ STAGES ("not_accepted" = settled and never accepted, etc.); filters {dimension:
    value}; anomaly one of ANOMALY_KINDS (handoffs flagged with it). ValueError otherwise.
    """
    db = check_db(database)
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    window = settled_window(client, db, window, tenant)
    params = _params(tenant)
    conds = [STAGES[stage], *_filters_sql(filters, params)]
    extra = ["task_id", "from_agent", "to_agent", *_dim_columns(tuple(filters or ()))]
    if anomaly is not None:
        from analytics.anomaly_kinds import anomaly_sql

        # the kind's flagged ids as a set built in the same query (no id list round trip)
        flagged = anomaly_sql(anomaly, db, window, tenant=tenant is not None)
        conds.append(f"handoff_id IN ({flagged})")
    sql = f"""
SELECT {", ".join(_LIST_COLUMNS)}
FROM ({cohort_sql(db, window, tenant_param=tenant is not None, extra=extra, last_state=True)})
WHERE {" AND ".join(f"({c})" for c in conds)}
ORDER BY created DESC, handoff_id
LIMIT {int(limit)}
"""
    return _shape_list(client.query_df(sql, parameters=params))


def _shape_list(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in _LIST_COLUMNS})
    df["created"] = pd.to_datetime(df["created"]).dt.tz_localize(None).dt.tz_localize("UTC")
    return df[list(_LIST_COLUMNS)].reset_index(drop=True)


def find_handoffs(
    client: Client, *, database: str | None = None, query: str, limit: int = 50
) -> pd.DataFrame:
    """Handoffs whose handoff_id, task_id or idempotency_key equals `query` (or whose
    handoff_id starts with it); same columns as handoffs_behind, newest first. The query
    is a bound parameter. ValueError for an empty query."""
    db = check_db(database)
    q = (query or "").strip()
    if not q:
        raise ValueError("query must be a non-empty handoff_id, task_id or idempotency_key")
    sql = f"""
SELECT handoff_id, max(task_id) AS task_id, tenant, max(from_agent) AS from_agent,
    max(to_agent) AS to_agent, max(mode) AS mode, min(created) AS created,
    {cs.last_state_expr("groupBitOr(tmask)")} AS last_state
FROM {db}.handoff_summary
WHERE handoff_id IN (
    SELECT handoff_id FROM {db}.handoff_transitions
    WHERE handoff_id = {{q:String}} OR task_id = {{q:String}} OR idempotency_key = {{q:String}}
       OR startsWith(handoff_id, {{q:String}})
)
GROUP BY tenant, handoff_id
ORDER BY created DESC, handoff_id
LIMIT {int(limit)}
"""
    return _shape_list(client.query_df(sql, parameters={"q": q}))
