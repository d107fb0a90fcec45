"""Where each handoff came from: the shim, an adapter, or derivation from framework spans.

A handoff's origin is read from its `create` transition, never from a column of its own
(the schema and the SQL decoder stay as they are):

| origin | how it is told |
|---|---|
| `derived:<rule>` | `handoff.derived_by` in the create span's attributes (derive/) |
| `adapter:<name>` | the create span's parent span is from the scope `collector.adapters.<name>` (the OpenAI Agents SDK adapter parents every create under its run span) |
| `shim` | neither: the shim, or another emitter of the wire contract |

Limits: an adapter whose creates have no parent span of its own scope (the A2A adapter)
shows as `shim`; a handoff without a stored create is not in the cohort at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from analytics._sql.cohort import Window, check_db, cohort_sql, settled_window, ts
from analytics.metrics import RATES, rate
from analytics.stages import CONDITIONS
from collector import semconv

if TYPE_CHECKING:
    import pandas as pd
    from clickhouse_connect.driver.client import Client

__all__ = [
    "DERIVED_BY",
    "ORIGINS",
    "ORIGIN_COUNTS",
    "ORIGIN_RATES",
    "funnel_by_origin",
    "has_adapter_spans",
    "origin_sql",
    "split_shim",
]

#: the attribute derive/ stamps on every derived transition (derive.DERIVED_BY)
DERIVED_BY: Final = semconv.DERIVED_BY
ADAPTER_SCOPE: Final = "collector.adapters."
ORIGINS: Final = ("shim", "adapter:<name>", "derived:<rule>")
#: how far before the window an adapter's run span may start (a run longer than this
#: shows its handoffs as `shim`)
_RUN_SPAN_LOOKBACK_S: Final = 86_400


def _adapter_spans_sql(db: str, window: Window) -> str:
    start, end = ts(window.start), ts(window.end)
    return f"""SELECT TraceId, SpanId, any(ScopeName) AS scope
    FROM {db}.otel_traces
    WHERE startsWith(ScopeName, '{ADAPTER_SCOPE}')
      AND Timestamp >= {start} - INTERVAL {_RUN_SPAN_LOOKBACK_S} SECOND AND Timestamp < {end}
    GROUP BY TraceId, SpanId"""


def origin_sql(db: str, window: Window, *, tenant_param: bool, adapters: bool = True) -> str:
    """SQL of one row per handoff created in `window` that is not from the shim: tenant,
    handoff_id, origin (a handoff it leaves out is `shim`). Only the create rows that carry
    `handoff.derived_by`, or whose parent span is one of the window's adapter spans, are
    grouped (`derived`: the typed flag of sql/012, so no other row's map is read); the
    adapter spans are few (one run span per agent run), so they are found
    first and the create rows are matched against them by (trace, parent span), in PREWHERE:
    the attribute map's values are read for the matching rows only. `adapters` False: the
    window has no adapter span (the caller checked), so no create row's trace and parent
    span are read to match them."""
    tenant_and = "AND tenant = {tenant:String}" if tenant_param else ""
    start, end = ts(window.start), ts(window.end)
    matched = "\n             OR (trace_id, parent_span_id) IN (SELECT TraceId, SpanId FROM adapter_spans)"
    return f"""
WITH adapter_spans AS ({_adapter_spans_sql(db, window)})
SELECT t.tenant AS tenant, t.handoff_id AS handoff_id,
    multiIf(t.derived_by != '', concat('derived:', t.derived_by),
            p.scope != '', concat('adapter:', substring(p.scope, {len(ADAPTER_SCOPE) + 1})),
            'shim') AS origin
FROM (
    SELECT tenant, handoff_id, any(attributes['{DERIVED_BY}']) AS derived_by,
        any(trace_id) AS create_trace, any(parent_span_id) AS create_parent
    FROM {db}.handoff_transitions
    PREWHERE event = 'create' AND time >= {start} AND time < {end} {tenant_and}
        AND (derived{matched if adapters else ""})
    GROUP BY tenant, handoff_id
) AS t
LEFT JOIN adapter_spans AS p ON p.TraceId = t.create_trace AND p.SpanId = t.create_parent
"""


def has_adapter_spans(client: Client, database: str, window: Window) -> bool:
    """Whether `window` (with the run-span lookback) holds an adapter span at all: one cheap
    read of otel_traces' scope names; origin_sql(adapters=False) when not."""
    sql = f"SELECT count() > 0 FROM ({_adapter_spans_sql(database, window)})"
    return bool(client.query(sql).result_rows[0][0])


#: the funnel counts split by origin (columns in this order), each as analytics.stages counts it
ORIGIN_COUNTS: Final = {
    name: f"countIf({CONDITIONS[name]})"
    for name in (
        "volume",
        "settled",
        "in_flight",
        "accepted",
        "executed",
        "evidenced",
        "committed",
        "unknown",
        "escalated",
        "unresolved_now",
    )
}
#: the metric contract's rates (analytics.metrics.RATES) whose counts are all split here
ORIGIN_RATES: Final = {
    k: (n, d) for k, (n, d) in RATES.items() if n in ORIGIN_COUNTS and d in ORIGIN_COUNTS
}


def split_shim(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counts per origin from the whole cohort's counts (the row with origin '') and the
    other origins' rows: the shim's are the cohort's minus theirs (every ORIGIN_COUNTS
    count is additive). Origins without handoffs are left out; sorted by origin. Pure."""
    total = next((r for r in rows if r["origin"] == ""), None)
    others = [r for r in rows if r["origin"] != ""]
    out = list(others)
    if total is not None:
        shim = {c: total[c] - sum(r[c] for r in others) for c in ORIGIN_COUNTS}
        out.append({"origin": "shim", **shim})
    return sorted((r for r in out if r["volume"]), key=lambda r: r["origin"])


def funnel_by_origin(
    client: Client, *, database: str | None = None, window: Window, tenant: str | None = None
) -> pd.DataFrame:
    """The funnel per origin: columns origin + ORIGIN_COUNTS (handoffs) + ORIGIN_RATES
    (fractions 0..1, NaN when undefined), one row per origin seen, sorted by origin."""
    import pandas as pd

    db = check_db(database)
    window = settled_window(client, db, window, tenant)
    t = tenant is not None
    counts = ",\n    ".join(f"{sql} AS {name}" for name, sql in ORIGIN_COUNTS.items())
    # every count is additive: the shim's are the cohort's minus the other origins' (their
    # handoffs are few, so only their summary rows are joined, never the whole cohort)
    within = "SELECT tenant, handoff_id FROM origins"
    adapters = has_adapter_spans(client, db, window)
    sql = f"""
WITH origins AS ({origin_sql(db, window, tenant_param=t, adapters=adapters)})
SELECT '' AS origin,
    {counts}
FROM ({cohort_sql(db, window, tenant_param=t, extra=())})
UNION ALL
SELECT o.origin AS origin,
    {counts}
FROM ({cohort_sql(db, window, tenant_param=t, extra=(), within=within)}) AS c
INNER JOIN origins AS o ON o.tenant = c.tenant AND o.handoff_id = c.handoff_id
WHERE o.origin != 'shim'
GROUP BY o.origin
"""
    params: dict[str, Any] = {"tenant": tenant} if t else {}
    got = client.query_df(sql, parameters=params)
    columns = ["origin", *ORIGIN_COUNTS, *ORIGIN_RATES]
    records = [{"origin": r["origin"], **{c: int(r[c]) for c in ORIGIN_COUNTS}}
               for r in got.to_dict("records")]  # fmt: skip
    df = pd.DataFrame(split_shim(records), columns=["origin", *ORIGIN_COUNTS])
    if df.empty:
        return pd.DataFrame(columns=columns)
    for c in ORIGIN_COUNTS:
        df[c] = df[c].astype("int64")
    for col, (num, den) in ORIGIN_RATES.items():
        df[col] = [rate(n, d) for n, d in zip(df[num], df[den], strict=True)]
    return df[columns].reset_index(drop=True)
