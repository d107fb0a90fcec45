"""Fleet graph and task graph figures (plotly) from a layout of dashboard/_graph_layout.py.

Pure: positions and edges in, a figure out; no Streamlit, no store. Colour = P_e2e on one
red-to-green scale (grey when no handoff settled), width = handoffs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from dashboard._graph_layout import (
    Edge,
    Layout,
    TaskNode,
    edge_curve,
    edge_width,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["RATE_SCALE", "fleet_figure", "rate_colour", "task_figure"]

_UNDEFINED = "#9e9e9e"  # no settled handoff: P_e2e undefined
_STATE_COLOURS = {
    "committed": "#2e7d32",
    "verified": "#1b5e20",
    "failed": "#c62828",
    "rejected": "#c62828",
    "expired": "#c62828",
    "unknown": "#ef6c00",
    "escalated": "#6a1b9a",
    "canceled": "#757575",
}


#: Red (low P_e2e) through amber to green (high); darker than RdYlGn so the middle of the
#: scale stays visible on white.
RATE_SCALE: tuple[tuple[float, str], ...] = (
    (0.0, "#b2182b"),
    (0.25, "#e66101"),
    (0.5, "#d4a000"),
    (0.75, "#7cb342"),
    (1.0, "#1b7837"),
)


def rate_colour(p: float | None) -> str:
    """The RATE_SCALE colour of a rate in [0, 1] (red low, green high); grey when undefined."""
    if p is None:
        return _UNDEFINED
    p = min(max(p, 0.0), 1.0)
    for (a, ca), (b, cb) in pairwise(RATE_SCALE):
        if p <= b:
            t = (p - a) / (b - a)
            rgb = [
                round(int(ca[i : i + 2], 16) * (1 - t) + int(cb[i : i + 2], 16) * t)
                for i in (1, 3, 5)
            ]
            return "#" + "".join(f"{v:02x}" for v in rgb)
    return RATE_SCALE[-1][1]


def _pct(p: float | None) -> str:
    return "—" if p is None else f"{p:.1%}"


def _edge_hover(e: Edge, back: Edge | None) -> str:
    lines = [
        f"<b>{e.source} → {e.target}</b>",
        f"P_e2e {_pct(e.p_e2e)} (committed {e.committed:,} of {e.settled:,} settled)",
        f"not committed {e.not_committed:,} · unknown outcome {e.unknown:,}",
        f"handoffs {e.volume:,} · in flight {e.in_flight:,}",
    ]
    if back is not None:
        lines.append(f"bounce: {e.target} → {e.source} also ({back.volume:,} handoffs)")
    return "<br>".join(lines) + "<br><i>click to list this pair's handoffs</i>"


def fleet_figure(layout: Layout, edges: Sequence[Edge], *, focus: str | None = None) -> go.Figure:
    """Agents as nodes, one curved arrow per directed pair: width by handoffs, colour by
    P_e2e (legend: the colour bar), dashed with a diamond at its middle when some outcome was
    unknown. The middle markers carry customdata [from_agent, to_agent] for selection.
    `focus` (an agent) draws only its own edges; the others stay as faint grey lines."""
    import plotly.graph_objects as go

    pos = layout.pos()
    unit_px = layout.plot_px / (2 * layout.extent)
    trim = 14 / unit_px  # the node marker's radius and a little air
    vmax = max((e.volume for e in edges), default=0)
    dense = len(edges) > 40  # thinner lines and smaller markers keep a big fleet legible
    hi_w, mark = (6.0, 9) if dense else (10.0, 12)
    pairs = {(e.source, e.target): e for e in edges}
    fig = go.Figure()
    annotations: list[dict[str, Any]] = []
    mids: list[tuple[float, float, Edge, Edge | None]] = []
    # the focused agent's edges last: drawn over the faded ones
    for e in sorted(edges, key=lambda e: focus is not None and focus in (e.source, e.target)):
        if e.source not in pos or e.target not in pos:
            continue
        width = edge_width(e.volume, vmax, hi=hi_w)
        colour = rate_colour(e.p_e2e)
        faded = focus is not None and focus not in (e.source, e.target)
        if e.source == e.target:  # a self-handoff: a small loop outside the node
            x0, y0 = pos[e.source]
            cx, cy, rr = x0 * 1.1, y0 * 1.1, 0.06
            pts = [
                (cx + rr * math.cos(2 * math.pi * k / 24), cy + rr * math.sin(2 * math.pi * k / 24))
                for k in range(25)
            ]
        else:
            pts = edge_curve(pos[e.source], pos[e.target], trim=trim)
        if faded:
            fig.add_scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="lines",
                line={"width": 1, "color": "#e0e0e0"},
                hoverinfo="skip",
                showlegend=False,
            )
            continue
        fig.add_scatter(
            x=[p[0] for p in pts],
            y=[p[1] for p in pts],
            mode="lines",
            line={"width": width, "color": colour, "dash": "dash" if e.unknown else "solid"},
            opacity=0.7 if dense else 0.85,
            hoverinfo="skip",
            showlegend=False,
        )
        if e.source != e.target and len(pts) >= 4:
            annotations.append(
                {
                    "x": pts[-1][0],
                    "y": pts[-1][1],
                    "ax": pts[-3][0],
                    "ay": pts[-3][1],
                    "xref": "x",
                    "yref": "y",
                    "axref": "x",
                    "ayref": "y",
                    "showarrow": True,
                    "arrowhead": 2,
                    "arrowsize": 1.0,
                    "arrowwidth": max(1.5, min(width * 0.6, 4.0)),
                    "arrowcolor": colour,
                    "text": "",
                }
            )
        mid = pts[len(pts) // 2]
        mids.append((mid[0], mid[1], e, pairs.get((e.target, e.source))))
    # one trace of middle markers: hover, click target and the colour legend
    fig.add_scatter(
        x=[m[0] for m in mids],
        y=[m[1] for m in mids],
        mode="markers",
        marker={
            "size": mark,
            "symbol": ["diamond" if m[2].unknown else "circle" for m in mids],
            "color": [m[2].p_e2e if m[2].p_e2e is not None else -1.0 for m in mids],
            # below 0 is the grey of an undefined rate; 0..1 the red-to-green scale
            "colorscale": [[0.0, _UNDEFINED], [0.0909, _UNDEFINED], *_scale_from(0.0909)],
            "cmin": -0.1,
            "cmax": 1.0,
            "line": {"width": 1.5, "color": "#263238"},
            "colorbar": {
                "title": {"text": "P_e2e"},
                "tickformat": ".0%",
                "tickvals": [0, 0.25, 0.5, 0.75, 1.0],
                "len": 0.6,
                "thickness": 14,
            },
        },
        customdata=[[m[2].source, m[2].target] for m in mids],
        hovertext=[_edge_hover(m[2], m[3]) for m in mids],
        hovertemplate="%{hovertext}<extra></extra>",
        showlegend=False,
        name="pairs",
    )
    volume: dict[str, int] = {}
    out_v: dict[str, int] = {}
    in_v: dict[str, int] = {}
    for e in edges:
        out_v[e.source] = out_v.get(e.source, 0) + e.volume
        in_v[e.target] = in_v.get(e.target, 0) + e.volume
    for n in layout.nodes:
        volume[n.name] = out_v.get(n.name, 0) + in_v.get(n.name, 0)
    nmax = max(volume.values(), default=0) or 1
    fig.add_scatter(
        x=[n.x for n in layout.nodes],
        y=[n.y for n in layout.nodes],
        mode="markers",
        marker={
            "size": [12 + 10 * math.sqrt(volume[n.name] / nmax) for n in layout.nodes],
            "color": ["#1565c0" if n.name == focus else "#37474f" for n in layout.nodes],
            "line": {"width": 2, "color": "white"},
        },
        hovertext=[
            f"<b>{n.name}</b><br>sends {out_v.get(n.name, 0):,} · receives {in_v.get(n.name, 0):,}"
            for n in layout.nodes
        ],
        hovertemplate="%{hovertext}<extra></extra>",
        showlegend=False,
        name="agents",
        unselected={"marker": {"opacity": 1}},  # a clicked edge does not dim the agents
    )
    for n in layout.nodes:
        annotations.append(
            {
                "x": n.label_x,
                "y": n.label_y,
                "xref": "x",
                "yref": "y",
                "text": f"<b>{n.label}</b>" if n.name == focus else n.label,
                "showarrow": False,
                "textangle": n.label_angle,
                "xanchor": "center",
                "yanchor": "middle",
                "font": {"size": 12, "color": "#263238"},
                "hovertext": n.name,
            }
        )
    rng = [-layout.extent, layout.extent]
    fig.update_layout(
        height=layout.plot_px,
        margin={"l": 4, "r": 4, "t": 4, "b": 4},
        xaxis={"range": rng, "visible": False, "fixedrange": True},
        yaxis={
            "range": rng,
            "visible": False,
            "scaleanchor": "x",
            "scaleratio": 1,
            "fixedrange": True,
        },
        annotations=annotations,
        plot_bgcolor="white",
        hoverlabel={"align": "left"},
        dragmode=False,
    )
    return fig


def _scale_from(start: float) -> list[list[Any]]:
    """RATE_SCALE squeezed into [start, 1] of a plotly colour scale."""
    return [[start + (1 - start) * at, c] for at, c in RATE_SCALE]


def task_figure(
    nodes: Sequence[TaskNode],
    states: Mapping[str, str] | None = None,
    *,
    current: str | None = None,
) -> go.Figure:
    """One task's handoffs left to right in causation order: arrows parent → child, each
    handoff a marker coloured by its last state and labelled "from → to / state", the
    `current` one ringed; the markers carry customdata [handoff_id] for selection."""
    import plotly.graph_objects as go

    states = states or {}
    at = {n.handoff_id: (n.x, -n.y) for n in nodes}
    fig = go.Figure()
    annotations = []
    for n in nodes:
        if n.parent in at:
            (x0, y0), (x1, y1) = at[n.parent], at[n.handoff_id]
            annotations.append(
                {
                    "x": x1 - 0.12,
                    "y": y1,
                    "ax": x0 + 0.12,
                    "ay": y0,
                    "xref": "x",
                    "yref": "y",
                    "axref": "x",
                    "ayref": "y",
                    "showarrow": True,
                    "arrowhead": 2,
                    "arrowwidth": 1.5,
                    "arrowcolor": "#607d8b",
                    "text": "",
                }
            )
    fig.add_scatter(
        x=[at[n.handoff_id][0] for n in nodes],
        y=[at[n.handoff_id][1] for n in nodes],
        mode="markers+text",
        text=[n.label for n in nodes],
        textposition="bottom center",
        marker={
            "size": 18,
            "color": [_STATE_COLOURS.get(states.get(n.handoff_id, ""), "#90a4ae") for n in nodes],
            "line": {
                "width": [4 if n.handoff_id == current else 1 for n in nodes],
                "color": "#263238",
            },
        },
        customdata=[[n.handoff_id] for n in nodes],
        hovertemplate="%{customdata[0]}<br>%{text}<extra></extra>",
        showlegend=False,
        cliponaxis=False,
    )
    cols = max((n.x for n in nodes), default=0) + 1
    rows = max((n.y for n in nodes), default=0) + 1
    fig.update_layout(
        height=max(180, 110 + 90 * rows),
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        title={"text": "Handoffs of this task, in causation order (left to right)", "x": 0},
        xaxis={"visible": False, "range": [-0.6, cols - 0.4], "fixedrange": True},
        yaxis={"visible": False, "range": [-rows + 0.3, 0.6], "fixedrange": True},
        annotations=annotations,
        plot_bgcolor="white",
    )
    return fig
