"""The SLO counts from the store: every window's funnel from one query, anomalies per window.

Every window ends at as_of and is a created-time cohort [as_of - length, as_of) with as_of
as the clock of the settle rule, so ratios and rates count settled handoffs only (a handoff
created a minute ago counts once it reached a terminal state). The scope `where` selects
one funnel row: tenant as the loaders' tenant filter, other dimensions as `by` groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from analytics._sql.cohort import Window
from analytics.slo.burn import Counts, Rule, SloStatus, evaluate, objective_counts

if TYPE_CHECKING:
    import pandas as pd
    from clickhouse_connect.driver.client import Client

__all__ = ["cohort_counts", "evaluate_rules", "window_counts"]

#: Flagged handoffs counted per anomaly window at most (handoffs_behind's row limit).
ANOMALY_LIMIT = 100_000


def _row(df: pd.DataFrame, where: dict[str, str]) -> dict[str, float]:
    from analytics.metrics import COUNT_COLUMNS

    for col, value in where.items():
        df = df[df[col].astype(str) == value]
    if not len(df):
        return dict.fromkeys(COUNT_COLUMNS, 0)
    return {c: float(df[c].sum()) for c in COUNT_COLUMNS}


def window_counts(
    client: Client, rule: Rule, *, as_of: datetime, database: str | None = None
) -> dict[timedelta, Counts]:
    """Counts of `rule`'s objective for each of rule.windows() ending at as_of (aware UTC):
    every window's funnel from one query (analytics.metrics.funnel_windows); an anomaly
    objective's flagged handoffs one query per window."""
    from analytics.metrics import funnel_windows, handoffs_behind

    where = dict(rule.where)
    tenant = where.pop("tenant", None)
    by = tuple(where)
    lengths = rule.windows()
    frames = funnel_windows(
        client, database=database, as_of=as_of, lengths=lengths, by=by, tenant=tenant
    )
    out: dict[timedelta, Counts] = {}
    for length in lengths:
        row = _row(frames[length], where)
        kind = rule.anomaly_kind
        if kind is not None:
            flagged = handoffs_behind(
                client,
                database=database,
                window=Window(start=as_of - length, end=as_of, as_of=as_of),
                stage="all",
                tenant=tenant,
                filters=where or None,
                anomaly=kind,
                limit=ANOMALY_LIMIT,
            )
            row["anomalous"] = float(len(flagged))
        out[length] = objective_counts(rule.objective, row)
    return out


def evaluate_rules(
    client: Client, rules: Sequence[Rule], *, as_of: datetime, database: str | None = None
) -> tuple[SloStatus, ...]:
    """Every rule evaluated at as_of (aware UTC) against the store."""
    return tuple(
        evaluate(r, window_counts(client, r, as_of=as_of, database=database), as_of=as_of)
        for r in rules
    )


def cohort_counts(
    client: Client, rule: Rule, *, window: Window, database: str | None = None
) -> Counts:
    """Counts of `rule`'s objective over one cohort window (created in [start, end), settled
    by window's clock), in the rule's scope: what the weekly report compares to the target."""
    from analytics.metrics import funnel, handoffs_behind

    where = dict(rule.where)
    tenant = where.pop("tenant", None)
    df = funnel(client, database=database, window=window, by=tuple(where), tenant=tenant)
    row = _row(df, where)
    kind = rule.anomaly_kind
    if kind is not None:
        flagged = handoffs_behind(
            client,
            database=database,
            window=window,
            stage="all",
            tenant=tenant,
            filters=where or None,
            anomaly=kind,
            limit=ANOMALY_LIMIT,
        )
        row["anomalous"] = float(len(flagged))
    return objective_counts(rule.objective, row)
