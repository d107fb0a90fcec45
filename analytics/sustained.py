"""When rejections stayed high: the runs of hours behind the sustained_rejections anomaly,
for any window they overlap (definition: analytics/_sql/sustained.py, docs/metrics.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._sql.cohort import Window, check_db, ns, settled_window
from analytics._sql.sustained import (
    HOUR_S,
    SustainedThresholds,
    hour_range,
    runs_sql,
    sustained_thresholds,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["MAX_LOOKBACK_HOURS", "SUSTAINED_COLUMNS", "sustained_rejections"]

#: Columns of sustained_rejections(), in order.
SUSTAINED_COLUMNS: Final = (
    "start",
    "end",
    "ongoing",
    "hours",
    "to_agent",
    "capability",
    "settled",
    "rejected",
    "rejection_rate",
    "handoffs",
)
#: how far before (and after) the window a run is followed, hours: a run reaching that far
#: is shown from (to) where the read stopped (90 days)
MAX_LOOKBACK_HOURS: Final = 90 * 24
_FIRST_PAD: Final = 24
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _at(b: int) -> datetime:
    return _EPOCH + timedelta(seconds=b * HOUR_S)


def sustained_rejections(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    thresholds: SustainedThresholds | None = None,
) -> pd.DataFrame:
    """The runs of sustained rejections that overlap the window, oldest first, one row per
    group and run: start (aware UTC datetime: the run's first hour), end (the end of its
    last hour; None when `ongoing`: the hour after it had not ended at the window's as_of
    clock, so it may go on), hours, to_agent, capability, settled and rejected (settled
    handoffs created in the run's hours, and those rejected), rejection_rate (0-1, over the
    run), handoffs (rejected handoffs of the window's cohort in the run: those
    anomalies()'s sustained_rejections flags; a handoff with two capabilities counts in both
    groups). Empty when none.

    A run is shown whole: the hours before and after the window are read in steps (24 h,
    then doubling) until no run reaches an edge read, at most MAX_LOOKBACK_HOURS on each
    side. `thresholds`: default sustained_thresholds() (the
    HANDOFFS_SUSTAINED_* settings); ValueError names a bad setting."""
    db = check_db(database)
    th = thresholds or sustained_thresholds()
    w = settled_window(client, db, window, tenant)
    params: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
    first, last = hour_range(w)
    now_b = ns(w.clock()) // (HOUR_S * 1_000_000_000)
    back = ahead = _FIRST_PAD
    while True:
        lo, hi = first - back, last + ahead
        sql = runs_sql(db, w, tenant=tenant is not None, th=th, first=lo, last=hi)
        rows = client.query(sql, parameters=params).result_rows
        # a run is followed while it reaches an edge read (an hour without data ends it)
        more_back = back < MAX_LOOKBACK_HOURS and any(r[2] == lo for r in rows)
        more_ahead = ahead < MAX_LOOKBACK_HOURS and any(r[3] == hi for r in rows)
        if not (more_back or more_ahead):
            break
        back = min(2 * back, MAX_LOOKBACK_HOURS) if more_back else back
        ahead = min(2 * ahead, MAX_LOOKBACK_HOURS) if more_ahead else ahead
    out = []
    for agent, cap, fb, lb, hours, n, r, ids in rows:
        if lb < first or fb > last:  # read around the window: keep the runs overlapping it
            continue
        ongoing = lb + 1 >= now_b
        out.append(
            {
                "start": _at(int(fb)),
                "end": None if ongoing else _at(int(lb) + 1),
                "ongoing": ongoing,
                "hours": int(hours),
                "to_agent": str(agent),
                "capability": str(cap),
                "settled": int(n),
                "rejected": int(r),
                "rejection_rate": int(r) / int(n),
                "handoffs": len(ids),
            }
        )
    df = pd.DataFrame(out, columns=list(SUSTAINED_COLUMNS))
    df["end"] = pd.Series([r["end"] for r in out], dtype=object)  # None, not NaT, when ongoing
    return df
