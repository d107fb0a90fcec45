"""Anomalies: each kind with its count and delta against the previous period; on request a
trend (counts over six equal slices of the window); examples link into the explorer.
The kinds of the protocol audit (retries, receipts, grants, tenants, versions, keyless writes)
have their own group, and
so do each topology's own failures with the schema-version window. When rejections spiked,
a table says when: the hour, the target and capability, its rate against its baseline; when
they stayed high, another gives each run's start, end (or ongoing) and rate.

The trend is off by default: each slice is one more anomalies() query, and on a large store
one query over a day takes tens of seconds (bench/dashboard_render.py's data, 10M rows).
"""

import pandas as pd
import streamlit as st

from analytics.display import markdown_link_text
from dashboard import _charts, _data, _ui

TREND_SLICES = 6
#: kinds shown under "Protocol audit"; every other kind analytics reports is under "Transitions"
PROTOCOL_AUDIT = (
    "blind_retry",
    "duplicate_execution",
    "consumed_before_verified",
    "expired_receipt_used",
    "wrong_consumer",
    "grant_expired",
    "capability_outside_grant",
    "grant_tenant_mismatch",
    "tenant_claim_mismatch",
    "retry_after_final_refusal",
    "keyless_duplicate_write",
    "grant_caller_mismatch",
    "missing_grant",
    "out_of_order_version",
)
#: kinds shown under "Topologies and compatibility": each topology's own failures, the
#: replayed commands and the schema-version window
TOPOLOGY = (
    "unfiltered_sensitive_history",
    "partial_result_committed",
    "fan_out_all",
    "consumer_lag",
    "consumer_stalled",
    "command_replayed",
    "stale_agent_card",
    "card_skill_refused",
    "incompatible_accepted",
    "risky_field_ignored",
)

src = _ui.start_page("Anomalies")
p = _ui.pickers(src, "anomalies")
show_trend = st.sidebar.toggle(
    f"Trend ({TREND_SLICES} slices of the window)",
    key="an_trend",
    persist_state="session",
    help=f"{TREND_SLICES} more anomaly queries: slow on a large store",
)

with _ui.guard():
    cur = _data.anomalies(src.store, src.database, *p.args, tenant=p.tenant)
    prev = _data.anomalies(src.store, src.database, *p.previous().args, tenant=p.tenant)
    step = (p.end - p.start) / TREND_SLICES
    slices = [
        _data.anomalies(
            src.store,
            src.database,
            (p.start + i * step).isoformat(),
            (p.start + (i + 1) * step).isoformat(),
            p.args[2],
            tenant=p.tenant,
            examples=0,
        )
        for i in range(TREND_SLICES if show_trend else 0)
    ]

if not len(cur):
    st.info("No anomaly kinds were reported.", icon=":material/inbox:")
    st.stop()

prev_counts = dict(zip(prev["kind"], prev["count"], strict=True)) if len(prev) else {}
trend = {
    k: [int(dict(zip(s["kind"], s["count"], strict=True)).get(k, 0)) for s in slices]
    for k in cur["kind"]
}
total = int(cur["count"].sum())
st.caption(
    f"{total:,} anomalies in {p.describe()}"
    + (f" · tenant {_ui.user_text(p.tenant)}" if p.tenant else "")
)

all_rows = list(cur.itertuples(index=False))
groups = (
    (
        "Transitions and outcomes",
        [r for r in all_rows if r.kind not in PROTOCOL_AUDIT and r.kind not in TOPOLOGY],
    ),
    ("Protocol audit", [r for r in all_rows if r.kind in PROTOCOL_AUDIT]),
    ("Topologies and compatibility", [r for r in all_rows if r.kind in TOPOLOGY]),
)
for title, rows in groups:
    if not rows:
        continue
    st.markdown(f"##### {title}")
    for start in range(0, len(rows), 4):
        cols = st.columns(4)
        for col, r in zip(cols, rows[start : start + 4], strict=False):
            delta = _ui.delta_count(r.count, prev_counts.get(r.kind))
            col.metric(
                str(r.kind).replace("_", " "),
                f"{int(r.count):,}",
                delta,
                delta_color=_ui.delta_color(delta, inverse=True),
                delta_arrow="off" if _ui.delta_color(delta) == "off" else "auto",
                help=f"{r.description}"
                + (
                    f" Bars: counts over {TREND_SLICES} equal slices of the window."
                    if show_trend
                    else ""
                ),
                chart_data=trend[r.kind] if show_trend else None,
                chart_type="bar",
                border=True,
            )


def _spikes_when(df: pd.DataFrame) -> None:
    """When each rejection spike happened: hour, group, rates (percent), flagged handoffs."""
    st.markdown("##### Rejection spikes: when")
    view = df.assign(
        hour=df["bucket_start"].dt.strftime("%Y-%m-%d %H:%M UTC"),
        rejection_rate=df["rejection_rate"] * 100,
        baseline_rate=df["baseline_rate"] * 100,
    )
    cols = ["hour", "to_agent", "capability", "settled", "rejected", "rejection_rate",
            "baseline_rate", "handoffs"]  # fmt: skip
    config = {
        "rejection_rate": st.column_config.NumberColumn("rate", format="%.1f%%"),
        "baseline_rate": st.column_config.NumberColumn("baseline (24 h before)", format="%.1f%%"),
        "handoffs": st.column_config.NumberColumn("handoffs flagged"),
    }
    st.dataframe(view[cols], hide_index=True, column_config=config, key="an_spikes_when")


if int(cur.loc[cur["kind"] == "rejection_spike", "count"].sum()):
    with _ui.guard():
        when = _data.rejection_spikes(src.store, src.database, *p.args, tenant=p.tenant)
    if len(when):
        _spikes_when(when)


def _runs_when(df: pd.DataFrame) -> None:
    """When rejections stayed high: each run's hours (end or ongoing), group, rate, flagged."""
    st.markdown("##### Sustained rejections: when")
    view = df.assign(
        start=df["start"].map(lambda t: f"{t:%Y-%m-%d %H:%M} UTC"),
        end=[
            "ongoing" if ongoing else f"{t:%Y-%m-%d %H:%M} UTC"
            for t, ongoing in zip(df["end"], df["ongoing"], strict=True)
        ],
        rejection_rate=df["rejection_rate"] * 100,
    )
    cols = ["start", "end", "hours", "to_agent", "capability", "settled", "rejected",
            "rejection_rate", "handoffs"]  # fmt: skip
    config = {
        "rejection_rate": st.column_config.NumberColumn("rate", format="%.1f%%"),
        "handoffs": st.column_config.NumberColumn("handoffs flagged"),
    }
    st.dataframe(view[cols], hide_index=True, column_config=config, key="an_runs_when")


if int(cur.loc[cur["kind"] == "sustained_rejections", "count"].sum()):
    with _ui.guard():
        runs = _data.sustained_rejections(src.store, src.database, *p.args, tenant=p.tenant)
    if len(runs):
        _runs_when(runs)

st.plotly_chart(_charts.anomaly_bars(cur), key="an_bars")

st.subheader("Examples")
kinds = [str(k) for k in cur["kind"]]
counts = dict(zip(cur["kind"], cur["count"], strict=True))
kind = st.selectbox(
    "Anomaly kind",
    kinds,
    index=next((i for i, k in enumerate(kinds) if counts[k]), 0),
    format_func=lambda k: f"{k} ({int(counts[k]):,})",
    key="an_kind",
)
row = cur[cur["kind"] == kind].iloc[0]
st.markdown(f"**{kind}** — {row['description']}")
if not int(row["count"]):
    st.info("None in this window.", icon=":material/check_circle:")
else:
    with _ui.guard():
        df = _data.handoffs_behind(
            src.store, src.database, *p.args, stage="all", tenant=p.tenant, anomaly=kind
        )
    if len(df):
        _ui.handoffs_table(df, key="an_behind_table")
    else:
        for hid in list(row["examples"])[:20]:
            st.markdown(f"- [{markdown_link_text(hid)}]({_ui.explorer_link(hid)})")
_ui.footer(src, "Anomalies")
