"""Fleet graph: agents as nodes, handoffs as directed edges (from_agent → to_agent).

Edge width is the pair's handoff volume, colour its P_e2e; dashed edges with a diamond had
unknown outcomes; a pair drawn both ways is a bounce. Clicking an edge's middle marker (or
picking the pair below) opens the pair's numbers and its handoffs. The numbers are one
analytics.funnel query by (from_agent, to_agent, mode, topology), rolled up per pair after
the mode and topology filters, so switching a filter needs no new query.
"""

import streamlit as st

from analytics.rollup import rollup
from dashboard import _data, _graph, _graph_layout, _ui

#: A larger fleet shows its busiest agents only (the circle stays readable).
MAX_AGENTS = 60
ALL = "All"
_STAGES = ("all", "not_accepted", "unknown", "committed", "in_flight")

src = _ui.start_page("Fleet graph")
p = _ui.pickers(src, "graph")
ss = st.session_state

with _ui.guard():
    split = _data.funnel(
        src.store,
        src.database,
        *p.args,
        by=("from_agent", "to_agent", "mode", "topology"),
        tenant=p.tenant,
    )
if not len(split) or not int(split["volume"].sum()):
    st.info(
        f"No handoffs were created in this window ({p.describe()}). Pick a longer range, or send "
        "spans to `handoffs serve` (try `handoffs demo`).",
        icon=":material/inbox:",
    )
    st.stop()

modes = [ALL, *sorted({str(m) for m in split["mode"]})]
topologies = [ALL, *sorted({str(t) for t in split["topology"]})]
for key, options in (("gr_mode", modes), ("gr_topology", topologies)):
    if ss.get(key) not in options:
        ss[key] = ALL  # a value from another window that has no handoffs here
mode = st.sidebar.selectbox("Mode", modes, key="gr_mode")
topology = st.sidebar.selectbox("Topology", topologies, key="gr_topology")
rows = split
if mode != ALL:
    rows = rows[rows["mode"] == mode]
if topology != ALL:
    rows = rows[rows["topology"] == topology]
pairs = rollup(rows, ("from_agent", "to_agent"))
edges = _graph_layout.edges_from_rows(pairs.to_dict("records"))
if not edges:
    st.info("No handoffs match these filters.", icon=":material/filter_alt_off:")
    st.stop()

busy: dict[str, int] = {}
for e in edges:
    busy[e.source] = busy.get(e.source, 0) + e.volume
    busy[e.target] = busy.get(e.target, 0) + e.volume
agents = sorted(busy, key=lambda a: (-busy[a], a))
if len(agents) > MAX_AGENTS:
    st.caption(
        f"{len(agents):,} agents: the {MAX_AGENTS} busiest are drawn; filter by tenant, mode or "
        "topology to see the others."
    )
    agents = agents[:MAX_AGENTS]
    edges = tuple(e for e in edges if e.source in agents and e.target in agents)
keys = {(e.source, e.target) for e in edges}
bounces = sorted({tuple(sorted(k)) for k in keys if (k[1], k[0]) in keys and k[0] != k[1]})
unknown_pairs = sum(1 for e in edges if e.unknown)

if ss.get("gr_focus") not in agents:
    ss["gr_focus"] = None
focus = st.sidebar.selectbox(
    "Focus on agent",
    sorted(agents),
    key="gr_focus",
    index=None,
    placeholder="All agents",
    help="Draw only this agent's handoffs (in and out); the others fade to grey.",
)
layout = _graph_layout.circular_layout(agents, edges)
event = st.plotly_chart(
    _graph.fleet_figure(layout, edges, focus=focus),
    key="gr_chart",
    on_select="rerun",
    selection_mode=("points",),
    config={"displayModeBar": False},
)
st.caption(
    f"{len(agents):,} agents, {len(edges):,} directed pairs · width: handoffs created in the "
    "window · colour: P_e2e of settled handoffs (bar on the right; grey: none settled) · "
    f"dashed with ◆: some outcome unknown ({unknown_pairs:,} pairs) · drawn both ways: a "
    f"bounce ({len(bounces):,} pairs) · click a ● or ◆ to open that pair."
)

# a click on an edge's middle marker picks the pair (node markers carry no pair)
clicked = None
for pt in (event.selection.points if event else None) or []:
    data = pt.get("customdata") if isinstance(pt, dict) else None
    if isinstance(data, list | tuple) and len(data) == 2:
        clicked = f"{data[0]}->{data[1]}"
shown = [e for e in edges if focus is None or focus in (e.source, e.target)]
worst = sorted(shown, key=lambda e: (e.p_e2e is None, e.p_e2e or 0.0, -e.volume))
options = [f"{e.source}->{e.target}" for e in worst]
if clicked and clicked != ss.get("gr_clicked") and clicked in options:
    ss["gr_pair"] = clicked  # before the selectbox exists: the click wins this run
ss["gr_clicked"] = clicked
if ss.get("gr_pair") not in options:
    ss["gr_pair"] = None

st.subheader("Agent pair")
c1, c2 = st.columns([2, 1])
pair = c1.selectbox(
    "Pair (worst P_e2e first)",
    options,
    key="gr_pair",
    index=None,
    placeholder="Click an edge, or pick a pair",
)
stage = c2.selectbox("Handoffs", _STAGES, key="gr_stage")
if pair is None:
    with st.expander("All pairs as a table (worst first)"):
        st.dataframe(
            [
                {
                    "pair": f"{e.source} → {e.target}",
                    "handoffs": e.volume,
                    "settled": e.settled,
                    "P_e2e": _ui.fmt_rate(e.p_e2e),
                    "not committed": e.not_committed,
                    "unknown": e.unknown,
                    "bounce": (e.target, e.source) in keys,
                }
                for e in worst
            ],
            hide_index=True,
            key="gr_pairs_table",
        )
else:
    edge = next(e for e in edges if f"{e.source}->{e.target}" == pair)
    back = next((e for e in edges if (e.source, e.target) == (edge.target, edge.source)), None)
    m = st.columns(5)
    m[0].metric("Handoffs", _ui.fmt_count(edge.volume))
    m[1].metric("Settled", _ui.fmt_count(edge.settled))
    m[2].metric("P_e2e", _ui.fmt_rate(edge.p_e2e))
    m[3].metric("Not committed", _ui.fmt_count(edge.not_committed))
    m[4].metric("Unknown outcome", _ui.fmt_count(edge.unknown))
    if back is not None:
        st.warning(
            f"Bounce: {edge.target} → {edge.source} also handed off {back.volume:,} times "
            f"(P_e2e {_ui.fmt_rate(back.p_e2e)}).",
            icon=":material/sync_alt:",
        )
    filters = [("pair", pair)]
    if mode != ALL:
        filters.append(("mode", mode))
    if topology != ALL:
        filters.append(("topology", topology))
    with _ui.guard():
        df = _data.handoffs_behind(
            src.store,
            src.database,
            *p.args,
            stage=stage,
            tenant=p.tenant,
            filters=tuple(sorted(filters)),
            limit=50,
        )
    _ui.handoffs_table(df, key="gr_behind_table")
_ui.footer(src, "Fleet graph")
