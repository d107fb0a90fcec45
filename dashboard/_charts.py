"""Plotly figures built from analytics frames; pure functions (no Streamlit, no store).

Rates are fractions in the frames and percent on the axes; undefined rates (NaN/None)
are left as gaps, never drawn as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FUNNEL_BARS",
    "anomaly_bars",
    "funnel_figure",
    "pair_heatmap",
    "stack_labels",
    "swimlane_label_boxes",
    "timeline_figure",
    "trend_figure",
]

#: the funnel chart's bars, (column in funnel(), label) in funnel order: S ⊇ A ⊇ E ⊇ V ⊇ K, and between E and V the
#: results whose evidence the emitter marked valid (V counts those the checks then passed).
FUNNEL_BARS = (
    ("settled", "Settled"),
    ("accepted", "Accepted"),
    ("executed", "Executed"),
    ("evidence_claimed", "Evidence claimed"),
    ("evidenced", "Evidenced"),
    ("committed", "Committed"),
)

_PERIOD_MS = {"hour": 3_600_000, "day": 86_400_000}
_LAYOUT: dict[str, Any] = {"margin": {"l": 10, "r": 10, "t": 40, "b": 10}, "height": 340}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def funnel_figure(row: dict[str, Any]) -> go.Figure:
    """Funnel of settled handoffs through each stage, counts with % of settled."""
    labels = [label for _, label in FUNNEL_BARS]
    values = [int(_num(row.get(col)) or 0) for col, _ in FUNNEL_BARS]
    fig = go.Figure(go.Funnel(y=labels, x=values, textinfo="value+percent initial"))
    fig.update_layout(title="Funnel of settled handoffs", **_LAYOUT)
    return fig


def trend_figure(
    df: pd.DataFrame,
    *,
    rates: tuple[str, ...] = ("p_e2e", "unknown_rate", "escalation_rate"),
    bucket: str | None = None,
    x_range: tuple[Any, Any] | None = None,
) -> go.Figure:
    """Rates per time bucket (lines, left axis, %) over settled volume (bars, right axis).

    `bucket` ("hour" | "day") centres each point in its period; `x_range` (start, end) shows
    the whole window even where it has no handoffs.
    """
    fig = go.Figure()
    x = list(df["bucket"]) if len(df) else []
    period: dict[str, Any] = {}
    if bucket in _PERIOD_MS:
        period = {"xperiod": _PERIOD_MS[bucket], "xperiodalignment": "middle"}
    if len(df):
        fig.add_bar(
            x=x,
            y=[_num(v) for v in df["settled"]],
            name="settled",
            yaxis="y2",
            opacity=0.3,
            # a lone bar has no neighbour to size it from: give it 80% of its period
            **({**period, "width": 0.8 * period["xperiod"]} if period else {}),
        )
        for col in rates:
            if col in df:
                fig.add_scatter(
                    x=x,
                    y=[_num(v) for v in df[col]],
                    name=col,
                    mode="lines+markers",
                    connectgaps=False,
                    **period,
                )
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    fig.update_layout(
        title="Trend per time bucket (UTC)",
        yaxis={"title": "rate", "tickformat": ".0%", "rangemode": "tozero"},
        yaxis2={
            "title": "settled",
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "rangemode": "tozero",
            "tickformat": ",d",
            # whole handoffs only: small counts would otherwise get fractional ticks
            **({"dtick": 1} if len(df) and (df["settled"].max() or 0) <= 8 else {}),
        },
        legend={"orientation": "h", "y": -0.2},
        **_LAYOUT,
    )
    return fig


#: the veil over a cell whose sample is too small to be called worst (a white wash at 70%)
SMALL_SAMPLE_VEIL = "rgba(255,255,255,0.7)"


def pair_heatmap(df: pd.DataFrame, *, value: str = "p_e2e", min_n: int = 0) -> go.Figure:
    """Matrix from_agent (rows) × to_agent (columns) of `value`, each cell with its settled count.

    Cells with fewer than `min_n` settled handoffs (but at least one) are faded: a second
    trace, "small sample", lays SMALL_SAMPLE_VEIL over them (its z is 1 there, None elsewhere),
    so 0% of 2 handoffs no longer shows as dark as a real problem."""
    if len(df):
        rates = df.pivot_table(
            index="from_agent", columns="to_agent", values=value, aggfunc="first", dropna=False
        )
        counts = df.pivot_table(
            index="from_agent", columns="to_agent", values="settled", aggfunc="first"
        )
        counts = counts.reindex(index=rates.index, columns=rates.columns)
        z = [[_num(v) for v in row] for row in rates.to_numpy()]
        custom = [[int(_num(v) or 0) for v in row] for row in counts.to_numpy()]
        # the sample size next to the rate: a red 0% of one handoff is not an alarm
        text = [
            [
                ("—" if _num(v) is None else f"{_num(v):.0%}<br>n={n}")
                for v, n in zip(row, nrow, strict=True)
            ]
            for row, nrow in zip(rates.to_numpy(), custom, strict=True)
        ]
        xs, ys = [str(c) for c in rates.columns], [str(i) for i in rates.index]
    else:
        z, text, custom, xs, ys = [], [], [], [], []
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=xs,
            y=ys,
            text=text,
            texttemplate="%{text}",
            customdata=custom,
            colorscale="RdYlGn",
            zmin=0,
            zmax=1,
            hovertemplate="%{y} → %{x}<br>"
            + value
            + " %{z:.1%}<br>settled %{customdata}<extra></extra>",
            colorbar={"tickformat": ".0%"},
        )
    )
    small = [[1 if 0 < n < min_n else None for n in row] for row in custom]
    if any(v for row in small for v in row):
        fig.add_heatmap(
            z=small,
            x=xs,
            y=ys,
            name="small sample",
            colorscale=[[0, SMALL_SAMPLE_VEIL], [1, SMALL_SAMPLE_VEIL]],
            showscale=False,
            hoverinfo="skip",
        )
    fig.update_layout(
        title=f"{value} by agent pair (from ↓, to →)",
        xaxis={"title": "to_agent", "type": "category"},
        yaxis={"title": "from_agent", "type": "category", "autorange": "reversed"},
        **{**_LAYOUT, "height": max(300, 80 + 54 * len(ys))},
    )
    return fig


def anomaly_bars(df: pd.DataFrame) -> go.Figure:
    """Horizontal bars: count per anomaly kind, largest on top."""
    ordered = df.sort_values("count") if len(df) else df
    fig = go.Figure(
        go.Bar(
            x=list(ordered["count"]) if len(df) else [],
            y=list(ordered["kind"]) if len(df) else [],
            orientation="h",
        )
    )
    if len(df) and (df["count"].max() or 0) <= 8:
        fig.update_xaxes(dtick=1, tickformat=",d")  # whole anomalies, no 0.2 ticks
    fig.update_layout(
        title="Anomalies in the window", **{**_LAYOUT, "height": max(300, 40 + 28 * len(df))}
    )
    return fig


#: Plot width (px) the swimlane's labels are laid out for; a wider drawing only adds room.
SWIMLANE_PX = 720
_LABEL_FONT = 11
_ROW_PX = 16  # one label row
_FIRST_PX = 10  # marker centre -> first label row
_MAX_ROWS = 4  # label rows on each side of a lane


def _label_px(text: str) -> float:
    """Estimated width (px) of a label at the swimlane font (an over-estimate)."""
    return len(text) * 0.62 * _LABEL_FONT + 8


def stack_labels(
    xs: Sequence[float], lanes: Sequence[int], widths: Sequence[float], *, gap: float = 4.0
) -> list[int]:
    """Label row of each point: 1, -1, 2, -2, ... (above, below its marker, then further
    out), the first row where its label (centred on x, `widths` px wide) clears the labels
    already in that row of its lane. xs in px. More than _MAX_ROWS rows each side are never
    used: the row whose last label ends first takes the label then."""
    levels = [k * side for k in range(1, _MAX_ROWS + 1) for side in (1, -1)]
    ends: dict[tuple[int, int], float] = {}
    rows = [0] * len(xs)
    for i in sorted(range(len(xs)), key=lambda i: (xs[i], i)):
        lo = xs[i] - widths[i] / 2

        def end(lv: int, lane: int = lanes[i]) -> float:
            return ends.get((lane, lv), -math.inf)

        pick = next((lv for lv in levels if end(lv) + gap <= lo), None)
        if pick is None:
            pick = min(levels, key=end)
        ends[(lanes[i], pick)] = xs[i] + widths[i] / 2
        rows[i] = pick
    return rows


def _shift(row: int) -> float:
    return math.copysign(_FIRST_PX + (abs(row) - 1) * _ROW_PX, row)


def timeline_figure(transitions: list[dict[str, Any]]) -> go.Figure:
    """Swimlanes: one lane per actor, a marker per transition at its time, labelled
    "n event → state" with n its place in the (state-machine) order given.

    A dotted line joins the transitions in that order, so a line running backwards in time
    shows clock skew between actors. Labels that would overlap (transitions milliseconds
    apart) are stacked in rows above and below the lane (stack_labels), laid out for a plot
    SWIMLANE_PX wide; the x range leaves room for the outermost labels.
    """
    import pandas as pd

    actors: list[str] = []
    for t in transitions:
        a = str(t.get("actor") or "?")
        if a not in actors:
            actors.append(a)
    xs = [t.get("time") for t in transitions]
    ys = [str(t.get("actor") or "?") for t in transitions]
    labels = [f"{t.get('event')} → {t.get('to_state')}" for t in transitions]
    texts = [f"{i + 1} {label}" for i, label in enumerate(labels)]
    colors = ["#2e7d32" if t.get("valid", True) else "#c62828" for t in transitions]
    times = pd.to_datetime(
        pd.Series(xs, dtype="object"), utc=True, errors="coerce", format="ISO8601"
    )
    ms = [None if pd.isna(v) else v.value / 1e6 for v in times]
    known = [v for v in ms if v is not None]
    widths = [_label_px(t) for t in texts]
    half = max(widths, default=0.0) / 2 + 6
    lo_ms, hi_ms = (min(known), max(known)) if known else (0.0, 0.0)
    span = hi_ms - lo_ms
    # the data fills the middle of the plot; half a label of room at each end
    full = span * SWIMLANE_PX / (SWIMLANE_PX - 2 * half) if span > 0 else 1000.0
    left = lo_ms - (full - span) / 2
    px = [
        None if v is None else (v - left) / full * SWIMLANE_PX for v in ms
    ]  # where each marker is drawn, at SWIMLANE_PX
    placed = [i for i, v in enumerate(px) if v is not None]
    rows = [0] * len(transitions)
    for i, r in zip(
        placed,
        stack_labels(
            [px[i] or 0.0 for i in placed],
            [actors.index(ys[i]) for i in placed],
            [widths[i] for i in placed],
        ),
        strict=True,
    ):
        rows[i] = r
    used = max((abs(r) for r in rows), default=1) or 1
    lane_px = max(70, 2 * (_FIRST_PX + used * _ROW_PX) + 12)
    fig = go.Figure()
    fig.add_scatter(
        x=xs,
        y=ys,
        mode="lines",
        line={"dash": "dot", "color": "#9e9e9e"},
        showlegend=False,
        hoverinfo="skip",
    )
    fig.add_scatter(
        x=xs,
        y=ys,
        mode="markers",
        text=texts,
        marker={"size": 14, "color": colors, "line": {"width": 1, "color": "#333"}},
        hovertemplate="%{y}<br>%{text}<br>%{x}<extra></extra>",
        showlegend=False,
        cliponaxis=False,
    )
    fig.update_layout(
        annotations=[
            {
                "x": x,
                "y": y,
                "text": text,
                "showarrow": False,
                "yshift": _shift(row),
                "yanchor": "bottom" if row > 0 else "top",
                "font": {"size": _LABEL_FONT},
                "bgcolor": "rgba(255,255,255,0.85)",
                "borderpad": 1,
            }
            for x, y, text, row, p in zip(xs, ys, texts, rows, px, strict=True)
            if p is not None
        ]
    )
    margin = {"l": 10, "r": 10, "t": 40, "b": 50}
    x_range = {}
    if known:
        x_range = {
            "range": [
                pd.Timestamp(int(left * 1e6)).tz_localize(None),
                pd.Timestamp(int((left + full) * 1e6)).tz_localize(None),
            ]
        }
    fig.update_layout(
        title="Transitions by actor (green valid, red flagged); n = order in the state machine",
        yaxis={
            "type": "category",
            "categoryorder": "array",
            "categoryarray": actors,
            "title": "actor",
            "range": [-0.5, len(actors) - 0.5],
            "fixedrange": True,
        },
        xaxis={"title": "time (UTC)", **x_range},
        margin=margin,
        height=int(margin["t"] + margin["b"] + lane_px * max(len(actors), 1)),
    )
    return fig


def swimlane_label_boxes(
    fig: go.Figure, *, plot_px: float = SWIMLANE_PX
) -> list[tuple[str, list[tuple[float, float]]]]:
    """(text, corners in px) of each transition label of a timeline_figure, in figure order,
    for a plot `plot_px` wide: x from the time axis range, y from the lane and the label's
    shift and anchor. The same width estimate as the layout (an over-estimate)."""
    import pandas as pd

    lo, hi = (pd.Timestamp(v).value for v in fig.layout.xaxis.range)
    lanes = list(fig.layout.yaxis.categoryarray)
    m = fig.layout.margin
    lane_px = (fig.layout.height - m.t - m.b) / len(lanes)
    h = _LABEL_FONT * 1.3 + 2
    out = []
    for a in fig.layout.annotations:
        t = pd.Timestamp(a.x)
        t = t.tz_convert(None) if t.tzinfo else t
        cx = (t.value - lo) / (hi - lo) * plot_px
        base = lanes.index(a.y) * lane_px + a.yshift
        cy = base + h / 2 if a.yanchor == "bottom" else base - h / 2
        w = _label_px(a.text)
        out.append(
            (
                str(a.text),
                [(cx - w / 2, cy - h / 2), (cx + w / 2, cy - h / 2),
                 (cx + w / 2, cy + h / 2), (cx - w / 2, cy + h / 2)],
            )
        )  # fmt: skip
    return out
