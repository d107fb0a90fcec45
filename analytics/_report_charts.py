"""The weekly report's charts as static SVG (pure): the funnel, the daily trend and the
handoffs lost per pair.

Why SVG: plotly.js inlined is 4.6 MB per report and a report must open offline; a drawn SVG
is a few kilobytes and prints as it shows. The look follows the dashboard's plotly charts
(dashboard/_charts.py, plotly's default template: its colours, grey-blue plot area, white
grid): the report may not import the dashboard (layers in pyproject.toml), so the few
shapes it needs are drawn here. Rates are fractions; NaN is a gap, never drawn as 0.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["funnel_svg", "lost_svg", "trend_svg"]

#: plotly's default colour sequence, the dashboard's trace colours in order
COLORS: Final = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A")
_FONT: Final = 'font-family="Open Sans, verdana, arial, sans-serif" fill="#2a3f5f"'
_PLOT_BG: Final = "#E5ECF6"
_W: Final = 1000


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _svg(height: int, title: str, body: list[str]) -> str:
    t = escape(title)
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" '
        f'width="100%" role="img" aria-label="{t}" {_FONT} font-size="12"><title>{t}</title>'
        f'<rect width="{_W}" height="{height}" fill="#fff"/>'
        f'<text x="10" y="24" font-size="17">{t}</text>{"".join(body)}</svg>'
    )


def _text(x: float, y: float, s: str, anchor: str = "start", **attrs: Any) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(s)}</text>'


def funnel_svg(row: dict[str, Any], stages: tuple[tuple[str, str], ...]) -> str:
    """Centred bars per (count column, label) of `row`, each with its count and % of the first."""
    values = [int(_num(row.get(c)) or 0) for c, _ in stages]
    top = max(values[0] if values else 0, 1)
    body, left, width, h = [], 140, _W - 160, 40
    for i, ((_, label), v) in enumerate(zip(stages, values, strict=True)):
        y = 44 + i * (h + 6)
        w = max(v / top * width, 1.0)
        x = left + (width - w) / 2
        body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{COLORS[0]}"/>')
        body.append(_text(left - 8, y + h / 2 + 4, label, "end"))
        pct = f"{v / values[0]:.0%}" if values[0] else "—"
        body.append(_text(left + width / 2, y + h / 2 + 4, f"{v:,} ({pct})", "middle", fill="#fff"))
    return _svg(44 + len(stages) * (h + 6) + 10, "Funnel of settled handoffs", body)


def trend_svg(daily: pd.DataFrame, rates: tuple[str, ...], title: str) -> str:
    """Rates per day (lines, left axis, %) over settled handoffs (bars, right axis), one
    point per row of `daily` (columns bucket, settled and each rate)."""
    n = len(daily)
    x0, x1, y0, y1 = 60, _W - 70, 44, 280  # plot area
    body = [f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="{_PLOT_BG}"/>']
    settled = [int(_num(v) or 0) for v in daily["settled"]] if n else []
    top = max(settled, default=0) or 1
    for k in range(5):  # grid at 0, 25, ..., 100%, counts on the right
        y = y1 - k * (y1 - y0) / 4
        body.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#fff"/>')
        body.append(_text(x0 - 6, y + 4, f"{k * 25}%", "end"))
        body.append(_text(x1 + 6, y + 4, f"{top * k / 4:,.0f}"))
    step = (x1 - x0) / max(n, 1)
    cx = [x0 + step * (i + 0.5) for i in range(n)]
    for x, v, b in zip(cx, settled, daily["bucket"] if n else [], strict=True):
        h = v / top * (y1 - y0)
        body.append(
            f'<rect x="{x - step * 0.4:.1f}" y="{y1 - h:.1f}" width="{step * 0.8:.1f}" '
            f'height="{h:.1f}" fill="{COLORS[0]}" fill-opacity="0.3"><title>{v:,} settled'
            "</title></rect>"
        )
        body.append(_text(x, y1 + 16, f"{b:%a %m-%d}", "middle"))
    legend = [(COLORS[0], "settled (right axis)")]
    for color, col in zip(COLORS[1:], rates, strict=False):
        legend.append((color, col))
        ys = [_num(v) for v in daily[col]] if n else []
        runs: list[list[str]] = [[]]
        for x, rv in zip(cx, ys, strict=True):
            if rv is None:
                runs.append([])  # a gap: the line stops
                continue
            py = y1 - rv * (y1 - y0)
            runs[-1].append(f"{x:.1f},{py:.1f}")
            body.append(f'<circle cx="{x:.1f}" cy="{py:.1f}" r="4" fill="{color}"><title>{col} '
                        f"{rv:.1%}</title></circle>")  # fmt: skip
        body += [
            f'<polyline points="{" ".join(r)}" fill="none" stroke="{color}" stroke-width="2"/>'
            for r in runs
            if len(r) > 1
        ]
    for i, (color, label) in enumerate(legend):
        x = x0 + i * 200
        body.append(f'<rect x="{x}" y="{y1 + 30}" width="14" height="10" fill="{color}"/>')
        body.append(_text(x + 20, y1 + 39, label))
    return _svg(y1 + 52, title, body)


def lost_svg(lost: pd.DataFrame, stages: tuple[str, ...]) -> str:
    """Horizontal bars, one per row of `lost` (analytics.pairs_lost), split by the stage each
    handoff was lost at (`lost_<stage>` columns), most lost on top."""
    rows = lost.to_dict(orient="records")
    top = max((int(r["lost"]) for r in rows), default=0) or 1
    left, width, h = 240, _W - 300, 22
    body = []
    for i, r in enumerate(rows):
        y = 44 + i * (h + 6)
        body.append(_text(left - 8, y + h / 2 + 4, str(r["pair"]).replace("->", " → "), "end"))
        x = float(left)
        for color, s in zip(COLORS[1:], stages, strict=False):
            w = int(r[f"lost_{s}"]) / top * width
            if w > 0:
                body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" '
                            f'fill="{color}"><title>{int(r[f"lost_{s}"]):,} lost at {s}'
                            "</title></rect>")  # fmt: skip
            x += w
        body.append(_text(x + 6, y + h / 2 + 4, f"{int(r['lost']):,}"))
    y = 44 + len(rows) * (h + 6) + 4
    for i, (color, s) in enumerate(zip(COLORS[1:], stages, strict=False)):
        body.append(f'<rect x="{left + i * 150}" y="{y}" width="14" height="10" fill="{color}"/>')
        body.append(_text(left + i * 150 + 20, y + 9, f"lost at {s}"))
    return _svg(y + 24, "Handoffs lost per agent pair, by stage", body)
