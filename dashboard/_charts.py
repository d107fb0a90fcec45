"""Plotly figures built from analytics frames; pure functions (no Streamlit, no store).

Rates are fractions in the frames and percent on the axes; undefined rates (NaN/None)
are left as gaps, never drawn as 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FUNNEL_STAGES",
    "anomaly_bars",
    "funnel_figure",
    "pair_heatmap",
    "timeline_figure",
    "trend_figure",
]

#: (column in funnel(), label) in funnel order: S ⊇ A ⊇ E ⊇ V ⊇ K.
FUNNEL_STAGES = (
    ("settled", "Settled"),
    ("accepted", "Accepted"),
    ("executed", "Executed"),
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
    labels = [label for _, label in FUNNEL_STAGES]
    values = [int(_num(row.get(col)) or 0) for col, _ in FUNNEL_STAGES]
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


def pair_heatmap(df: pd.DataFrame, *, value: str = "p_e2e") -> go.Figure:
    """Matrix from_agent (rows) × to_agent (columns) of `value`, each cell with its settled count."""
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


def _padded_range(times: list[Any]) -> dict[str, Any]:
    """An x range 8% wider than the data each side, so edge labels are not cut off."""
    import pandas as pd

    ts = pd.to_datetime(
        pd.Series([t for t in times if t is not None]), utc=True, errors="coerce"
    ).dropna()
    if ts.empty:
        return {}
    lo, hi = ts.min(), ts.max()
    pad = max((hi - lo) * 0.08, pd.Timedelta(seconds=1))
    return {"range": [(lo - pad).tz_localize(None), (hi + pad).tz_localize(None)]}


def timeline_figure(transitions: list[dict[str, Any]]) -> go.Figure:
    """Swimlanes: one lane per actor, a marker per transition at its time, labelled by event.

    Transitions keep the given (state-machine) order; a dotted line joins them in that
    order, so a line running backwards in time shows clock skew between actors.
    """
    actors: list[str] = []
    for t in transitions:
        a = str(t.get("actor") or "?")
        if a not in actors:
            actors.append(a)
    xs = [t.get("time") for t in transitions]
    ys = [str(t.get("actor") or "?") for t in transitions]
    labels = [f"{t.get('event')} → {t.get('to_state')}" for t in transitions]
    colors = ["#2e7d32" if t.get("valid", True) else "#c62828" for t in transitions]
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
        mode="markers+text",
        text=labels,
        # alternate above/below: transitions milliseconds apart would print over each other
        textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(labels))],
        marker={"size": 14, "color": colors, "line": {"width": 1, "color": "#333"}},
        hovertemplate="%{y}<br>%{text}<br>%{x}<extra></extra>",
        showlegend=False,
        cliponaxis=False,  # labels above the top lane stay visible
    )
    fig.update_layout(
        title="Transitions by actor (green valid, red flagged)",
        yaxis={
            "type": "category",
            "categoryorder": "array",
            "categoryarray": actors,
            "title": "actor",
            "range": [-0.7, len(actors) - 0.3],  # headroom for labels above and below
        },
        xaxis={"title": "time (UTC)", **_padded_range(xs)},
        **{**_LAYOUT, "height": max(260, 120 + 70 * len(actors))},
    )
    return fig
