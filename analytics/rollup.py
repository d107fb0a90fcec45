"""Roll a split funnel up to coarser groups: sum the counts, recompute the rates (pure).

Why: one split funnel query serves several views of the same cohort. The dashboard's
Overview reads `funnel(by=("tenant",), bucket=...)` for its tiles, trend and tenant list
(switching tenant needs no new query), the Slices page one split by pair, mode, topology
and protocol, the weekly report one by pair, mode and day. Every count column of
analytics.funnel is a sum over handoffs, and each handoff lies in exactly one group of a
split by single-valued dimensions (not capability: one row per capability), so sums of
groups are exact. Rates come from analytics.metrics.RATES, the
metric contract's one table; tests compare the result with analytics.funnel itself.
"""

from __future__ import annotations

import pandas as pd

from analytics.metrics import COUNT_COLUMNS, RATE_COLUMNS, add_rates

__all__ = ["empty_split", "rollup"]


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
