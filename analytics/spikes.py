"""When rejection spikes happened: the spiking (to_agent, capability, bucket) rows behind the
rejection_spike anomaly, for any window (definition: analytics/_sql/spikes.py, docs/metrics.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import pandas as pd

from analytics._sql.cohort import Window, check_db
from analytics._sql.spikes import (
    SPIKE_BASELINE_BUCKETS,
    SPIKE_BASELINE_FACTOR,
    SPIKE_BUCKET_S,
    SPIKE_MARGIN,
    SPIKE_MIN_RATE,
    SPIKE_MIN_REJECTED,
    SPIKE_MIN_SETTLED,
    spikes_sql,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "SPIKE_BASELINE_BUCKETS",
    "SPIKE_BASELINE_FACTOR",
    "SPIKE_BUCKET_S",
    "SPIKE_COLUMNS",
    "SPIKE_MARGIN",
    "SPIKE_MIN_RATE",
    "SPIKE_MIN_REJECTED",
    "SPIKE_MIN_SETTLED",
    "rejection_spikes",
]

#: Columns of rejection_spikes(), in order.
SPIKE_COLUMNS: Final = (
    "bucket_start",
    "to_agent",
    "capability",
    "settled",
    "rejected",
    "rejection_rate",
    "baseline_settled",
    "baseline_rate",
    "handoffs",
)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def rejection_spikes(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    bucket_s: int = SPIKE_BUCKET_S,
    baseline_buckets: int = SPIKE_BASELINE_BUCKETS,
) -> pd.DataFrame:
    """The spiking buckets that touch the window, oldest first, one row per group and
    bucket: bucket_start (aware UTC datetime), to_agent, capability, settled and rejected
    (settled handoffs created in the whole bucket, and those rejected), rejection_rate
    (0-1), baseline_settled and baseline_rate (the `baseline_buckets` buckets before),
    handoffs (rejected handoffs of the window's cohort flagged from this bucket; a handoff
    with two capabilities counts in both groups). Empty when nothing spiked.

    With the defaults (hourly buckets, 24 h baseline) the flagged handoffs are exactly those
    of anomalies()'s rejection_spike. ValueError for a bad bucket_s (an integer >= 60 that
    divides a day or is whole days) or baseline_buckets (>= 1)."""
    db = check_db(database)
    sql = spikes_sql(
        db, window, tenant=tenant is not None, bucket_s=bucket_s, baseline=baseline_buckets
    )
    params = {"tenant": tenant} if tenant is not None else {}
    rows = client.query(sql, parameters=params).result_rows
    out = [
        {
            "bucket_start": _EPOCH + timedelta(seconds=int(b) * bucket_s),
            "to_agent": str(agent),
            "capability": str(cap),
            "settled": int(n),
            "rejected": int(r),
            "rejection_rate": int(r) / int(n),
            "baseline_settled": int(bn),
            "baseline_rate": int(br) / int(bn),
            "handoffs": int(h),
        }
        for b, agent, cap, n, r, bn, br, h in rows
    ]
    return pd.DataFrame(out, columns=list(SPIKE_COLUMNS))
