"""The funnel and the anomaly counts as plain Python values, without pandas: for a process
that keeps the dataframe libraries out (serve's `GET /metrics`, serve._funnel_metrics).

The same SQL pieces as analytics.metrics and analytics.anomaly_kinds (the cohort and its
contract flags, the stages of analytics.stages, the anomaly passes); tests hold the numbers
equal to funnel() and anomalies() on the same store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from analytics._sql.anomalies import PASSES, pass_sql
from analytics._sql.cohort import (
    DIM_COLUMNS,
    Window,
    check_db,
    check_dims,
    cohort_sql,
    dim_expr,
    settled_window,
    ts,
)
from analytics.oracle.funnel import UNKNOWN_SLA_MS
from analytics.stages import CONDITIONS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["AgedCounts", "anomaly_counts", "funnel_by_age"]


@dataclass(frozen=True, slots=True)
class AgedCounts:
    """One group's funnel counts (handoffs) per cohort age: `counts[i][j]` is stage
    `stages[j]` of the cohort created in the `ages[i]` before `as_of`."""

    keys: tuple[str, ...]
    counts: tuple[tuple[int, ...], ...]


def funnel_by_age(
    client: Client,
    *,
    database: str | None = None,
    as_of: datetime,
    ages: Sequence[timedelta],
    by: Sequence[str] = ("tenant", "from_agent", "to_agent"),
    stages: Sequence[str] = tuple(CONDITIONS),
) -> list[AgedCounts]:
    """Funnel counts (`stages`: names of analytics.stages.FUNNEL, all by default; handoffs)
    per group of `by` (plain dimensions; `pair` and `capability` refused)
    for the cohorts created in [as_of - age, as_of) for each age, settled as of `as_of`:
    one scan of the longest. Groups sorted by keys. ValueError for an unknown dimension or
    stage, an empty or non-positive age, or a naive `as_of`."""
    db = check_db(database)
    dims = check_dims(tuple(by))
    if not dims or any(d in ("pair", "capability") for d in dims):
        raise ValueError(f"by must name plain dimensions (not pair/capability), got {dims!r}")
    if not ages or any(a <= timedelta(0) for a in ages):
        raise ValueError(f"ages must be positive durations, got {list(ages)!r}")
    for s in stages:
        if s not in CONDITIONS:
            raise ValueError(f"unknown stage {s!r}; choose from {', '.join(CONDITIONS)}")
    window = settled_window(
        client, db, Window(start=as_of - max(ages), end=as_of, as_of=as_of), None
    )
    extra = [c for d in dims for c in DIM_COLUMNS[d]]
    cols = [
        f"countIf(created >= {ts(as_of - age)} AND ({CONDITIONS[s]}))"
        for age in ages
        for s in stages
    ]
    keys = ", ".join(f"{dim_expr(d)} AS {d}" for d in dims)
    sql = f"""
SELECT {keys}, {", ".join(cols)}
FROM ({cohort_sql(db, window, tenant_param=False, extra=extra)})
GROUP BY {", ".join(dims)} ORDER BY {", ".join(dims)}
"""
    n, width = len(dims), len(stages)
    out = []
    for row in client.query(sql).result_rows:
        vals = [int(v) for v in row[n:]]
        out.append(
            AgedCounts(
                keys=tuple(str(k) for k in row[:n]),
                counts=tuple(tuple(vals[i * width : (i + 1) * width]) for i in range(len(ages))),
            )
        )
    return out


def anomaly_counts(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    unknown_sla_ms: int = UNKNOWN_SLA_MS,
) -> dict[str, int]:
    """{kind: handoffs flagged} for every kind of analytics.ANOMALY_KINDS (zeros
    included) in the window's cohort, as anomalies() counts them: one query per pass."""
    db = check_db(database)
    params: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
    window = settled_window(client, db, window, tenant)
    found: dict[str, int] = {}
    for name, kinds in PASSES.items():
        inner = pass_sql(name, db, window, tenant=tenant is not None, sla_ms=unknown_sla_ms)
        cols = ", ".join(f"uniqExactIf(handoff_id, {k})" for k in kinds)
        row = client.query(f"SELECT {cols} FROM ({inner})", parameters=params).result_rows[0]
        found.update({k: int(v) for k, v in zip(kinds, row, strict=True)})
    return found
