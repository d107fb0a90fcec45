"""The funnel's count and rate columns, the metric contract's one rate table, and roll-ups
of a split funnel to coarser groups: sum the counts, recompute the rates (pure).

Why: one split funnel query serves several views of the same cohort. The dashboard's
Overview reads `funnel(by=("tenant",), bucket=...)` for its tiles and trend (switching
tenant needs no new query), the Slices page one split by pair, mode, topology and protocol,
the weekly report one by pair, mode and day, and the SLO windows one split by ring
(analytics.metrics.funnel_windows). Every count column of
analytics.funnel is a sum over handoffs, and each handoff lies in exactly one group of a
split by single-valued dimensions (not capability: one row per capability), so sums of
groups are exact. Rates come from RATES below (analytics.metrics re-exports the table);
tests compare the result with analytics.funnel itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import pandas as pd

from analytics.stages import FUNNEL

__all__ = [
    "COUNT_COLUMNS",
    "OUTCOMES",
    "OUTCOME_COLUMNS",
    "RATES",
    "RATE_COLUMNS",
    "add_rates",
    "empty_split",
    "outcomes",
    "rate",
    "rollup",
]

#: How handoffs ended, each counted once per cohort handoff that has it (docs/metrics.md
#: "Outcomes"): entered rejected, expired, failed, canceled, escalated; unknown_open entered
#: unknown and never left it, unknown_resolved entered it and left it later. Column names in
#: a funnel frame are `outcome_<name>`.
OUTCOMES: Final = (
    "rejected",
    "expired",
    "failed",
    "canceled",
    "escalated",
    "unknown_open",
    "unknown_resolved",
)
OUTCOME_COLUMNS: Final = tuple(f"outcome_{o}" for o in OUTCOMES)

#: funnel()'s count columns (handoffs): the stages of analytics.stages, then the outcomes
COUNT_COLUMNS: Final = (*(s.name for s in FUNNEL), *OUTCOME_COLUMNS)
#: rate column -> (numerator count, denominator count), the metric contract's one table
#: (docs/metrics.md); an empty denominator gives NaN. funnel() and every roll-up use it.
RATES: Final = {
    "p_accept": ("accepted", "settled"),
    "p_execute": ("executed", "accepted"),
    "p_evidence": ("evidenced", "executed"),
    # beside P_evidence: the results the emitter marked valid, before the platform's checks
    "p_evidence_claimed": ("evidence_claimed", "executed"),
    "p_commit": ("committed", "evidenced"),
    "p_e2e": ("committed", "settled"),
    "p_verify": ("verified", "committed"),
    "unknown_rate": ("unknown", "settled"),
    "escalation_rate": ("escalated", "settled"),
}
RATE_COLUMNS: Final = tuple(RATES)


def rate(num: float, den: float) -> float:
    """num/den, or NaN when den is 0 (an undefined rate is never shown as 0)."""
    return float(num) / float(den) if den else math.nan


def outcomes(row: Mapping[str, Any] | pd.Series) -> dict[str, int]:
    """The outcome counts of one funnel row (a mapping or a pandas row) under their short
    names (OUTCOMES), as `handoffs metrics --json` prints them in its "outcomes" object."""
    return {o: int(row[f"outcome_{o}"]) for o in OUTCOMES}


def add_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Set every rate column of `df` (float64, NaN where undefined) from its count columns,
    as RATES says; returns `df`."""
    for col, (num, den) in RATES.items():
        df[col] = pd.Series(
            [rate(n, d) for n, d in zip(df[num], df[den], strict=True)],
            index=df.index,
            dtype="float64",
        )
    return df


def empty_split(keys: tuple[str, ...]) -> pd.DataFrame:
    """A funnel frame with no groups (an empty window) and the usual columns."""
    cols = {k: pd.Series(dtype="object") for k in keys}
    cols.update({c: pd.Series(dtype="int64") for c in COUNT_COLUMNS})
    cols.update({c: pd.Series(dtype="float64") for c in RATE_COLUMNS})
    return pd.DataFrame(cols)


def rollup(
    df: pd.DataFrame, keys: tuple[str, ...] = (), *, tenant: str | None = None
) -> pd.DataFrame:
    """Sum `df`'s counts per `keys` (all rows when keys=()), after keeping only `tenant`'s rows
    when given; rates recomputed. keys=() always returns exactly one row (zeros when empty)."""
    if tenant is not None and "tenant" in df:
        df = df[df["tenant"] == tenant]
    counts = list(COUNT_COLUMNS)
    if keys:
        out = (
            df.groupby(list(keys), sort=True, as_index=False)[counts].sum()
            if len(df)
            else empty_split(keys)
        )
    else:
        out = pd.DataFrame([{c: int(df[c].sum()) if len(df) else 0 for c in counts}])
    for c in counts:
        out[c] = out[c].astype("int64")
    return add_rates(out)[[*keys, *counts, *RATE_COLUMNS]].reset_index(drop=True)
