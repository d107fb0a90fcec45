"""Roll a split funnel up to coarser groups: sum the counts, recompute the rates (pure).

Why: one `funnel(by=("tenant",), bucket=...)` query gives the Overview its tiles, its trend
and the tenant list, and switching tenant needs no new query. Every count column of
analytics.funnel is a sum over handoffs, and each handoff lies in exactly one (tenant,
bucket) group, so sums of groups are exact. Rates follow the metric contract (docs/design.md);
tests compare the result with analytics.funnel itself.
"""

from __future__ import annotations

import math
from typing import Final

import pandas as pd

from analytics.metrics import COUNT_COLUMNS, RATE_COLUMNS

__all__ = ["RATES", "empty_split", "rollup"]

#: rate column -> (numerator count, denominator count); an empty denominator gives NaN.
RATES: Final = {
    "p_accept": ("accepted", "settled"),
    "p_execute": ("executed", "accepted"),
    "p_evidence": ("evidenced", "executed"),
    "p_commit": ("committed", "evidenced"),
    "p_e2e": ("committed", "settled"),
    "unknown_rate": ("unknown", "settled"),
    "escalation_rate": ("escalated", "settled"),
}
if set(RATES) != set(RATE_COLUMNS):  # analytics added or renamed a rate: fail loudly at import
    raise ImportError(
        f"dashboard._rollup.RATES {sorted(RATES)} != analytics RATE_COLUMNS {sorted(RATE_COLUMNS)}"
    )


def empty_split(keys: tuple[str, ...]) -> pd.DataFrame:
    """A funnel frame with no groups (an empty window) and the usual columns."""
    cols = {k: pd.Series(dtype="object") for k in keys}
    cols.update({c: pd.Series(dtype="int64") for c in COUNT_COLUMNS})
    cols.update({c: pd.Series(dtype="float64") for c in RATE_COLUMNS})
    return pd.DataFrame(cols)


def _rates(df: pd.DataFrame) -> pd.DataFrame:
    for col, (num, den) in RATES.items():
        df[col] = [
            float(n) / float(d) if d else math.nan for n, d in zip(df[num], df[den], strict=True)
        ]
        df[col] = df[col].astype("float64")
    return df


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
    return _rates(out)[[*keys, *counts, *RATE_COLUMNS]].reset_index(drop=True)
