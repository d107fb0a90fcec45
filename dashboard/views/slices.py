"""Slices: the pairs losing the most handoffs, with the failing stage; the agent-pair matrix
of P_e2e, small samples faded; each topology's own failure rates as cards, with
the shared queue's consumer lag and agent-as-tool fan-out; the keyless side-effecting writes
per pair (`?sl_keyless=true` opens them); tables by mode, topology,
protocol, capability, contract version, each with its slices' outcome counts (rejected,
expired, failed, canceled, escalated, unknown open / resolved).

Tables are worst first (lowest P_e2e; undefined last) and every slice can list its handoffs.
The total, the pair matrix and the mode, topology and protocol tables are one funnel query
split by all of them, rolled up here (analytics.rollup: counts are sums over handoffs);
capability, a handoff in one row per capability, is its own query. Only what is shown is
queried: the selected tab (`?sl_tab=<label>` opens one) and the queue expander once opened
(`?sl_queue=true`); each reruns the page when switched.
"""

import pandas as pd
import streamlit as st

from analytics.pairs_lost import MIN_N, lost_by_pair
from analytics.rollup import OUTCOMES, rollup
from dashboard import _charts, _data, _keyless_data, _topology_data, _ui

_RATE_COLS = (
    "p_e2e",
    "p_accept",
    "p_execute",
    "p_evidence",
    "p_commit",
    "unknown_rate",
    "escalation_rate",
)
_COUNT_COLS = ("settled", "in_flight", "volume")
#: how each slice's handoffs ended (analytics OUTCOMES), shown after the rates
_OUTCOME_COLS = {f"outcome_{o}": o.replace("_", " ") for o in OUTCOMES}
#: the dimensions the page's one split funnel is grouped by (each a handoff's single value)
_SPLIT = ("from_agent", "to_agent", "mode", "topology", "protocol")
_TABLES = (
    ("mode", "Mode"),
    ("topology", "Topology"),
    ("protocol", "Protocol version"),
    ("capability", "Capability"),
    ("contract_version", "Contract version"),
)
_LATENCY_TAB = "Latency by pair"
#: rows of the "most handoffs lost" table above the heatmap
_TOP_LOST = 5

src = _ui.start_page("Slices")
p = _ui.pickers(src, "slices")


def _table(df: pd.DataFrame, dim: str) -> None:
    cols = [dim, *(c for c in _COUNT_COLS if c in df), *(c for c in _RATE_COLS if c in df)]
    cols += [c for c in _OUTCOME_COLS if c in df]
    view = df[cols].sort_values("p_e2e", ascending=True, na_position="last", kind="stable")
    for c in _RATE_COLS:  # fractions -> percent with one decimal; NaN stays empty ("—")
        if c in view:
            view[c] = view[c] * 100
    config = {c: st.column_config.NumberColumn(c, format="%.1f%%") for c in _RATE_COLS}
    config.update({c: st.column_config.NumberColumn(n) for c, n in _OUTCOME_COLS.items()})
    st.dataframe(
        view, hide_index=True, column_config=config, placeholder=_ui.DASH, key=f"sl_tab_{dim}"
    )


def _lost_table(pairs: pd.DataFrame) -> None:
    """The pairs (at least MIN_N settled) that lose the most handoffs beyond the fleet's rate,
    and where."""
    lost = lost_by_pair(pairs)
    top = lost[lost["rankable"] & (lost["lost"] > 0)].head(_TOP_LOST)
    st.markdown(
        f"**Most handoffs lost beyond the fleet's rate** (pairs with at least {MIN_N} settled)"
    )
    if not len(top):
        st.caption(f"No pair with at least {MIN_N} settled handoffs lost any.")
        return
    view = top.assign(
        pair=top["from_agent"] + " → " + top["to_agent"],
        excess_lost=top["excess_lost"].round(0),
    )[["pair", "lost", "excess_lost", "failing_stage", "settled"]]
    st.dataframe(
        view.rename(columns={"failing_stage": "failing stage", "settled": "n"}),
        hide_index=True,
        key="sl_lost",
        column_config={
            "lost": st.column_config.NumberColumn("lost", help="settled, not committed"),
            "excess_lost": st.column_config.NumberColumn(
                "beyond fleet",
                format="%+.0f",
                help="lost minus what the pair would lose at the whole fleet's rate",
            ),
            "failing stage": st.column_config.TextColumn(
                help="the stage losing the most: accept, execute, evidence or commit"
            ),
            "n": st.column_config.NumberColumn("n", help="settled handoffs"),
        },
    )


def _topology_cards(cards: pd.DataFrame) -> None:
    """One column per topology: a metric per kind of its own (rate, flagged of handoffs)."""
    topologies = list(dict.fromkeys(cards["topology"]))
    for col, topology in zip(st.columns(max(1, len(topologies))), topologies, strict=False):
        rows = cards[cards["topology"] == topology]
        n = int(rows["handoffs"].iloc[0]) if len(rows) else 0
        col.markdown(f"**{topology}** · {n:,} handoffs")
        for r in rows.itertuples(index=False):
            col.metric(
                str(r.kind).replace("_", " "),
                _ui.fmt_rate(r.rate if n else None),
                help=f"{int(r.flagged):,} of {n:,} {topology} handoffs flagged {r.kind}",
                border=True,
            )


def _queue_tables() -> None:
    with _ui.guard():
        lag = _topology_data.queue_lag(src.store, src.database, *p.args, tenant=p.tenant)
        fan = _topology_data.task_fan_out(src.store, src.database, *p.args, tenant=p.tenant)
    st.markdown("**Consumer lag** (enqueue → accept, ms; the slowest consumers first)")
    ms = {c: st.column_config.NumberColumn(c, format="%.0f") for c in lag if c.endswith("_ms")}
    st.dataframe(
        lag.sort_values("p95_ms", ascending=False, na_position="last", kind="stable"),
        hide_index=True,
        placeholder=_ui.DASH,
        key="sl_queue_lag",
        column_config=ms,
    )
    st.markdown("**Fan-out** (distinct experts and handoffs per task, per orchestrator)")
    st.dataframe(fan, hide_index=True, placeholder=_ui.DASH, key="sl_fan_out")


def _keyless_table() -> None:
    with _ui.guard():
        df = _keyless_data.keyless_writes(src.store, src.database, *p.args, tenant=p.tenant)
    st.markdown(
        "**Keyless side-effecting writes** (commands and shared-queue handoffs sent without "
        "an idempotency key, per pair; the largest share first)"
    )
    if not len(df):
        st.caption("No command or shared-queue handoff was created in this window.")
        return
    view = df.assign(
        pair=df["from_agent"] + " → " + df["to_agent"], keyless_share=df["keyless_share"] * 100
    )[["pair", "side_effecting", "keyless", "keyless_share", "duplicates"]]
    st.dataframe(
        view,
        hide_index=True,
        key="sl_keyless_table",
        column_config={
            "side_effecting": st.column_config.NumberColumn(
                "side-effecting", help="commands and shared-queue handoffs created in the window"
            ),
            "keyless": st.column_config.NumberColumn("keyless", help="without an idempotency key"),
            "keyless_share": st.column_config.NumberColumn("keyless share", format="%.1f%%"),
            "duplicates": st.column_config.NumberColumn(
                "duplicates", help="flagged keyless_duplicate_write: the same payload applied twice"
            ),
        },
    )


def _frame(name: str) -> pd.DataFrame:
    """The funnel by one dimension: rolled up from the page's split, or (capability) its own
    cached query."""
    if name in _SPLIT:
        return rollup(split, (name,))
    with _ui.guard():
        return _data.funnel(src.store, src.database, *p.args, by=(name,), tenant=p.tenant)


def _latency_table() -> None:
    with _ui.guard():
        lat = _data.latencies(src.store, src.database, *p.args, by=("pair",), tenant=p.tenant)
    cols = [
        "pair",
        *(f"{s}_{q}_ms" for s in ("accept", "result", "commit") for q in ("p50", "p95")),
        "commit_n",
    ]
    view = lat[[c for c in cols if c in lat]].sort_values(
        "commit_p95_ms", ascending=False, na_position="last"
    )
    st.caption(
        "Milliseconds: accept = created→accepted, result = running→first result, commit = "
        "created→committed; slowest commit p95 first; commit_n = handoffs measured."
    )
    st.dataframe(
        view,
        hide_index=True,
        placeholder=_ui.DASH,
        key="sl_latency",
        column_config={
            c: st.column_config.NumberColumn(c, format="%.0f") for c in cols if c.endswith("_ms")
        },
    )


with _ui.guard():
    split = _data.funnel(src.store, src.database, *p.args, by=_SPLIT, tenant=p.tenant)
total = rollup(split)
if not len(total) or not total["volume"].sum():
    st.info(
        f"No handoffs were created in this window ({p.describe()}). Pick a longer range, or send "
        "spans to `handoffs serve` (try `handoffs demo`).",
        icon=":material/inbox:",
    )
    st.stop()
pairs = rollup(split, ("from_agent", "to_agent"))

_lost_table(pairs)
st.plotly_chart(_charts.pair_heatmap(pairs, min_n=MIN_N), key="sl_heatmap")
st.caption(
    "Cells show P_e2e of settled handoffs from the row agent to the column agent; “—”: none "
    f"settled. Faded cells: fewer than {MIN_N} settled, too few to call a pair worst."
)

with st.expander("Agent pairs as a table (worst first)"):
    _table(pairs.assign(pair=pairs["from_agent"] + " → " + pairs["to_agent"]), "pair")

st.subheader("Each topology's own failures")
with _ui.guard():
    cards = _topology_data.topology_cards(src.store, src.database, *p.args, tenant=p.tenant)
_topology_cards(cards)
st.caption(
    "Share of each topology's handoffs created in the window that the anomaly kind flags "
    "(kinds: `handoffs anomalies`); the shared queue's lag and the agent-as-tool fan-out below."
)


# only what is shown is queried: the queue expander once opened, the selected tab
queue = st.expander(
    "Shared queue: consumer lag, and agent-as-tool fan-out per task",
    key="sl_queue",
    on_change="rerun",
    bind="query-params",
)
with queue:
    if queue.open:
        _queue_tables()

keyless = st.expander(
    "Keyless side-effecting writes per agent pair",
    key="sl_keyless",
    on_change="rerun",
    bind="query-params",
)
with keyless:
    if keyless.open:
        _keyless_table()

tabs = st.tabs(
    [label for _, label in _TABLES] + [_LATENCY_TAB],
    key="sl_tab",
    on_change="rerun",
    bind="query-params",
)
for tab, (name, _label) in zip(tabs, _TABLES, strict=False):
    if tab.open:
        with tab:
            _table(_frame(name), name)
if tabs[-1].open:
    with tabs[-1]:
        _latency_table()

st.subheader("Handoffs behind a slice")
c1, c2, c3 = st.columns(3)
dims = {"pair": "Agent pair", **dict(_TABLES)}
dim: str = c1.selectbox("Dimension", list(dims), format_func=lambda d: dims[d], key="sl_dim")
if dim == "pair":
    values = sorted(
        f"{a}->{b}" for a, b in zip(pairs["from_agent"], pairs["to_agent"], strict=True)
    )
else:
    values = sorted(str(v) for v in _frame(dim)[dim])
value = c2.selectbox("Value", values, index=None, placeholder="Pick a slice", key="sl_value")
stage = c3.selectbox(
    "Stage",
    ("settled", "not_accepted", "committed", "unknown", "escalated", "in_flight"),
    key="sl_stage",
)
if value is not None:
    with _ui.guard():
        df = _data.handoffs_behind(
            src.store, src.database, *p.args, stage=stage, tenant=p.tenant, filters=((dim, value),)
        )
    _ui.handoffs_table(df, key="sl_behind_table")
_ui.footer(src, "Slices")
