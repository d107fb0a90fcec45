"""Fleet graph layout: agents on a circle, handoffs as curved directed edges (pure).

Nodes + edges in, positions out: no plotly, no Streamlit, no store (the figures are in
dashboard/_graph.py). Units: the layout is in
"data units" (the node circle has radius 1); every pixel figure is an estimate for a square
plot of `plot_px` pixels, the size the figure is drawn at (equal axis scales). Labels sit
outside the circle: horizontal while they fit, else along the radius (a sunburst), and cut
to LABEL_CHARS characters (the full name is in the hover).

The per-task layout (`task_layers`) places one task's handoffs left to right in causation
order: a handoff sits one column right of the handoff that caused it; without causation ids
the handoffs form one chain in created order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

__all__ = [
    "CHAR_PX",
    "LABEL_CHARS",
    "Edge",
    "Layout",
    "NodePos",
    "TaskNode",
    "boxes_overlap",
    "circular_layout",
    "edge_curve",
    "edge_width",
    "edges_from_rows",
    "label_box",
    "order_nodes",
    "plot_px_for",
    "task_layers",
]

#: Width of one label character as a fraction of the font size (a safe over-estimate).
CHAR_PX = 0.62
#: Labels longer than this are cut with "…".
LABEL_CHARS = 18
_RING = 1.0  # node circle radius, data units
_GAP = 0.07  # node -> label distance, data units


@dataclass(frozen=True, slots=True)
class Edge:
    """One directed agent pair over the window: counts of handoffs, P_e2e (None: undefined)."""

    source: str
    target: str
    volume: int
    settled: int
    committed: int
    unknown: int
    in_flight: int
    p_e2e: float | None

    @property
    def not_committed(self) -> int:
        """Settled handoffs that did not end committed with evidence (failed in the funnel)."""
        return self.settled - self.committed


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def edges_from_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[Edge, ...]:
    """Edges from funnel rows keyed by from_agent/to_agent; pairs with no handoffs dropped."""
    out = []
    for r in rows:
        if not int(r.get("volume") or 0):
            continue
        out.append(
            Edge(
                source=str(r["from_agent"]),
                target=str(r["to_agent"]),
                volume=int(r["volume"]),
                settled=int(r.get("settled") or 0),
                committed=int(r.get("committed") or 0),
                unknown=int(r.get("unknown") or 0),
                in_flight=int(r.get("in_flight") or 0),
                p_e2e=_num(r.get("p_e2e")),
            )
        )
    return tuple(sorted(out, key=lambda e: (e.source, e.target)))


@dataclass(frozen=True, slots=True)
class NodePos:
    """A node at (x, y) and its label: centre (label_x, label_y), text angle (degrees,
    clockwise as plotly's textangle), the text as drawn (cut) and its box size (data units)."""

    name: str
    x: float
    y: float
    label: str
    label_x: float
    label_y: float
    label_angle: float
    label_w: float
    label_h: float


@dataclass(frozen=True, slots=True)
class Layout:
    """Positions of every node; `extent` the half-width of a square range that holds all
    labels; `labels` "horizontal" or "radial"; `plot_px` the size the estimate assumed."""

    nodes: tuple[NodePos, ...]
    extent: float
    labels: Literal["horizontal", "radial"]
    plot_px: int

    def pos(self) -> dict[str, tuple[float, float]]:
        return {n.name: (n.x, n.y) for n in self.nodes}


def plot_px_for(n_nodes: int) -> int:
    """Figure height (px) for a graph of n nodes: larger fleets get a larger square."""
    return int(min(900, max(560, 520 + 10 * n_nodes)))


def order_nodes(nodes: Iterable[str], edges: Sequence[Edge]) -> list[str]:
    """Nodes in circle order: start at the busiest, then each time the unplaced node most
    connected (by volume) to the placed ones, so heavy pairs sit close (fewer long chords).
    Ties break by name: the order is deterministic."""
    names = sorted(set(nodes) | {e.source for e in edges} | {e.target for e in edges})
    weight: dict[tuple[str, str], int] = {}
    total = dict.fromkeys(names, 0)
    for e in edges:
        if e.source == e.target:
            continue
        key = (min(e.source, e.target), max(e.source, e.target))
        weight[key] = weight.get(key, 0) + e.volume
        total[e.source] += e.volume
        total[e.target] += e.volume
    if not names:
        return []
    placed = [min(names, key=lambda n: (-total[n], n))]
    left = set(names) - set(placed)
    while left:
        last = placed[-1]

        def score(n: str, last: str = last) -> tuple[int, int, int, str]:
            to_last = weight.get((min(n, last), max(n, last)), 0)
            to_all = sum(weight.get((min(n, p), max(n, p)), 0) for p in placed)
            return (-to_last, -to_all, -total[n], n)

        nxt = min(left, key=score)
        placed.append(nxt)
        left.remove(nxt)
    return placed


def _cut(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def label_box(n: NodePos) -> list[tuple[float, float]]:
    """The four corners of a node's label box (data units), rotated by its text angle."""
    a = math.radians(-n.label_angle)  # plotly's angle is clockwise; data y points up
    ux, uy = math.cos(a), math.sin(a)
    vx, vy = -uy, ux
    hw, hh = n.label_w / 2, n.label_h / 2
    cx, cy = n.label_x, n.label_y
    return [
        (cx + sx * hw * ux + sy * hh * vx, cy + sx * hw * uy + sy * hh * vy)
        for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))
    ]


def boxes_overlap(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    """True when two convex polygons intersect (separating-axis test; touching is not overlap)."""
    for poly in (a, b):
        for i in range(len(poly)):
            x1, y1 = poly[i]
            x2, y2 = poly[(i + 1) % len(poly)]
            nx, ny = y2 - y1, x1 - x2
            pa = [nx * x + ny * y for x, y in a]
            pb = [nx * x + ny * y for x, y in b]
            if max(pa) <= min(pb) + 1e-9 or max(pb) <= min(pa) + 1e-9:
                return False
    return True


def _place(order: Sequence[str], *, unit_px: float, font_px: float, radial: bool) -> list[NodePos]:
    n = len(order)
    h = font_px * 1.3 / unit_px
    out = []
    for i, name in enumerate(order):
        phi = math.pi / 2 - 2 * math.pi * i / max(n, 1)  # from the top, clockwise
        ux, uy = math.cos(phi), math.sin(phi)
        text = _cut(name)
        w = len(text) * CHAR_PX * font_px / unit_px
        r = _RING + _GAP
        if radial:
            # along the ray, centre half a label out; the left half reads from the outside in
            cx, cy = (r + w / 2) * ux, (r + w / 2) * uy
            deg = math.degrees(phi)
            angle = -deg if ux >= -1e-9 else 180 - deg
        else:
            # the box's inner corner (or edge midpoint, at the top/bottom/sides) on the ray
            sx, sy = max(-1.0, min(1.0, 2 * ux)), max(-1.0, min(1.0, 2 * uy))
            cx, cy = r * ux + sx * w / 2, r * uy + sy * h / 2
            angle = 0.0
        x, y = _RING * ux, _RING * uy
        out.append(NodePos(name, x, y, text, cx, cy, (angle + 180) % 360 - 180, w, h))
    return out


def _collides(nodes: Sequence[NodePos]) -> bool:
    boxes = [label_box(n) for n in nodes]
    return any(
        boxes_overlap(boxes[i], boxes[j])
        for i in range(len(boxes))
        for j in range(i + 1, len(boxes))
    )


def circular_layout(
    nodes: Iterable[str],
    edges: Sequence[Edge] = (),
    *,
    plot_px: int | None = None,
    font_px: float = 12.0,
) -> Layout:
    """Nodes evenly on a circle (order from `order_nodes`), labels outside it.

    Horizontal labels when no two label boxes overlap, else radial ones. The pixel scale is
    solved so that the circle plus the longest label fits a square of `plot_px` (default
    plot_px_for(n)). A fleet so large that even radial labels would touch (over ~120 agents
    at the default size) still gets radial labels: the caller should filter it first.
    """
    order = order_nodes(nodes, edges)
    px = plot_px or plot_px_for(len(order))
    longest = max((len(_cut(n)) for n in order), default=1)
    label_px = longest * CHAR_PX * font_px
    placed: list[NodePos] = []
    mode: Literal["horizontal", "radial"] = "horizontal"
    for mode in ("horizontal", "radial"):
        # half the square holds the ring, the gap and one label (+ 4% margin), in pixels
        unit_px = max((px / 2 * 0.96 - label_px) / (_RING + _GAP), px / 8)
        placed = _place(order, unit_px=unit_px, font_px=font_px, radial=mode == "radial")
        if not _collides(placed):
            break
    extent = max(
        [_RING + _GAP] + [max(abs(c) for pt in label_box(nd) for c in pt) for nd in placed]
    )
    return Layout(nodes=tuple(placed), extent=extent * 1.04, labels=mode, plot_px=px)


def edge_curve(
    p0: tuple[float, float],
    p1: tuple[float, float],
    *,
    bend: float = 0.12,
    trim: float = 0.0,
    steps: int = 24,
) -> list[tuple[float, float]]:
    """Points of a quadratic curve from p0 to p1 bent to the right of its direction by
    `bend` × its length (so A→B and B→A lie on opposite sides), without the parts within
    `trim` of either end (the node markers). The middle point is at index len // 2."""
    (x0, y0), (x1, y1) = p0, p1
    dx, dy = x1 - x0, y1 - y0
    cx, cy = (x0 + x1) / 2 + bend * dy, (y0 + y1) / 2 - bend * dx  # right-hand normal
    pts = []
    for k in range(steps + 1):
        t = k / steps
        x = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1
        y = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1
        if math.hypot(x - x0, y - y0) >= trim and math.hypot(x - x1, y - y1) >= trim:
            pts.append((x, y))
    return pts or [((x0 + x1) / 2, (y0 + y1) / 2)]


def edge_width(volume: int, vmax: int, *, lo: float = 1.5, hi: float = 10.0) -> float:
    """Line width (px) for an edge's volume: area-like (square root) between lo and hi."""
    if vmax <= 0 or volume <= 0:
        return lo
    return lo + (hi - lo) * math.sqrt(min(volume, vmax) / vmax)


@dataclass(frozen=True, slots=True)
class TaskNode:
    """One handoff of a task at column `x` (causation depth) and row `y`; `parent` the
    handoff it follows (its causation id, or the previous one in created order)."""

    handoff_id: str
    x: int
    y: int
    parent: str | None
    label: str


def task_layers(handoffs: Sequence[Mapping[str, Any]]) -> tuple[TaskNode, ...]:
    """Columns of a task's handoffs in causation order.

    Each mapping needs handoff_id and created (anything orderable), optionally causation_id,
    from_agent, to_agent, last_state. A causation id naming another handoff of the task
    makes that handoff the parent; when no handoff has such an id, each follows the previous
    one in created order. A cycle of causation ids is cut at the earliest created handoff.
    """
    rows = sorted(handoffs, key=lambda r: (r["created"], str(r["handoff_id"])))
    ids = {str(r["handoff_id"]) for r in rows}
    cause = {
        str(r["handoff_id"]): str(r.get("causation_id") or "")
        for r in rows
        if str(r.get("causation_id") or "") in ids - {str(r["handoff_id"])}
    }
    if not cause:
        chain = [str(r["handoff_id"]) for r in rows]
        cause = {h: p for p, h in pairwise(chain)}
    depth: dict[str, int] = {}
    for r in rows:  # created order: a cause created later than its effect is still handled
        h = str(r["handoff_id"])
        seen, cur, d = {h}, h, 0
        while cur in cause and cause[cur] not in seen:
            cur = cause[cur]
            seen.add(cur)
            d += 1
        depth[h] = d
    rows_used: dict[int, int] = {}
    out = []
    for r in rows:
        h = str(r["handoff_id"])
        x = depth[h]
        y = rows_used.get(x, 0)
        rows_used[x] = y + 1
        label = f"{r.get('from_agent') or '?'} → {r.get('to_agent') or '?'}"
        state = r.get("last_state")
        out.append(TaskNode(h, x, y, cause.get(h), label + (f"<br>{state}" if state else "")))
    return tuple(out)
