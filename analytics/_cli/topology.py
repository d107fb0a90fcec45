"""The topology tables of `handoffs metrics` (unsliced): task level, queue lag, agent-as-tool
fan-out, unknown envelope fields. Loaders and formatting only; analytics/_cli/metrics.py prints.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from foundation.units import fmt_duration_ms

if TYPE_CHECKING:
    import pandas as pd
    from clickhouse_connect.driver.client import Client

    from analytics._sql.cohort import Window

#: table name -> (title, columns shown); numbers are counts, lags (`_ms` columns) durations
TITLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue_lag": (
        "queue lag (enqueue -> accept) and messages not taken, per consumer and queue",
        (
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
        ),
    ),
    "task_fan_out": (
        "agent-as-tool fan-out per orchestrator (per task: distinct experts, attempts)",
        ("orchestrator", "tasks", "experts_p50", "experts_p95", "attempts_p50", "attempts_p95"),
    ),
    "unknown_fields": (
        "envelope fields consumers did not know, per consumer and schema version",
        ("consumer", "schema_version", "field", "handoffs"),
    ),
}


def tables(client: Client, db: str, window: Window, tenant: str | None) -> dict[str, pd.DataFrame]:
    """The three topology tables of the window's cohort (analytics.topology)."""
    from analytics.topology import queue_lag, task_fan_out, unknown_fields

    return {
        name: fn(client, window, database=db, tenant=tenant)
        for name, fn in (
            ("queue_lag", queue_lag),
            ("task_fan_out", task_fan_out),
            ("unknown_fields", unknown_fields),
        )
    }


def tasks(client: Client, db: str, window: Window, tenant: str | None) -> dict[str, Any]:
    """Task level (analytics.metrics.task_stats), NaN as None."""
    from analytics.metrics import task_stats

    got = task_stats(client, database=db, window=window, tenant=tenant)
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in got.items()}


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v) if v != "" else "(none)"


def rows(name: str, df: pd.DataFrame) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, formatted rows) of one table for the terminal."""
    title, cols = TITLES[name]
    header = [c.removesuffix("_ms") for c in cols]
    return (
        title,
        header,
        [
            [fmt_duration_ms(r[c]) if c.endswith("_ms") else _cell(r[c]) for c in cols]
            for r in df.to_dict(orient="records")
        ],
    )


def tasks_line(t: dict[str, Any]) -> str:
    rate = t["task_success_rate"]
    per = t["attempts_per_task"]
    return (
        f"tasks: {t['tasks']:,}, {t['tasks_committed']:,} committed with evidence "
        f"({'—' if rate is None else f'{100 * rate:.1f} %'}), "
        f"{'—' if per is None else f'{per:.2f}'} handoffs per task"
    )
