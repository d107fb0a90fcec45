"""The fleet graph's pure layout: positions, label collisions, edges, the per-task columns."""

from __future__ import annotations

import math
import random

import pytest

from dashboard import _graph as g
from dashboard import _graph_layout as gl

SMALL = ("planner", "coder", "reviewer", "tester", "researcher", "writer", "critic", "router")


def _fleet(n: int, seed: int = 7) -> tuple[list[str], list[gl.Edge]]:
    rnd = random.Random(seed)
    names = [
        f"agent-{i:02d}-{rnd.choice(['billing', 'search', 'triage'])}-worker" for i in range(n)
    ]
    edges = []
    for i, a in enumerate(names):
        for b in rnd.sample(names, 3):
            if a != b:
                edges.append(gl.Edge(a, b, rnd.randint(1, 50), 10, 7, i % 2, 1, 0.7))
    return names, edges


def _no_label_overlaps(layout: gl.Layout) -> list[tuple[str, str]]:
    boxes = [(n.name, gl.label_box(n)) for n in layout.nodes]
    return [
        (a, b)
        for i, (a, ba) in enumerate(boxes)
        for b, bb in boxes[i + 1 :]
        if gl.boxes_overlap(ba, bb)
    ]


def test_eight_agents_sit_on_the_circle_with_horizontal_labels():
    layout = gl.circular_layout(SMALL)
    assert sorted(n.name for n in layout.nodes) == sorted(SMALL)
    assert layout.labels == "horizontal"
    for n in layout.nodes:
        assert math.hypot(n.x, n.y) == pytest.approx(1.0)
        assert n.label_angle == 0
    assert not _no_label_overlaps(layout)


@pytest.mark.parametrize("n", [8, 20, 40, 60])
def test_labels_never_collide_and_stay_outside_the_circle(n):
    names, edges = _fleet(n)
    layout = gl.circular_layout(names, edges)
    assert not _no_label_overlaps(layout)
    for node in layout.nodes:
        corners = gl.label_box(node)
        # outside the ring of nodes and inside the plotted square
        assert min(math.hypot(x, y) for x, y in corners) > 1.0
        assert max(max(abs(x), abs(y)) for x, y in corners) <= layout.extent
        assert len(node.label) <= gl.LABEL_CHARS


def test_forty_agents_get_radial_labels():
    names, edges = _fleet(40)
    layout = gl.circular_layout(names, edges)
    assert layout.labels == "radial"
    assert layout.plot_px == gl.plot_px_for(40) > gl.plot_px_for(8)
    # readable: no label upside down
    assert all(-90 <= n.label_angle <= 90 for n in layout.nodes)


def test_order_puts_heavy_pairs_next_to_each_other():
    edges = [
        gl.Edge("a", "b", 100, 1, 1, 0, 0, 1.0),
        gl.Edge("c", "d", 90, 1, 1, 0, 0, 1.0),
        gl.Edge("b", "c", 1, 1, 1, 0, 0, 1.0),
    ]
    order = gl.order_nodes(["a", "b", "c", "d", "lonely"], edges)
    assert order[-1] == "lonely"
    assert abs(order.index("a") - order.index("b")) == 1
    assert abs(order.index("c") - order.index("d")) == 1
    assert gl.order_nodes(["a", "b", "c", "d", "lonely"], edges) == order  # deterministic


def test_layout_is_deterministic_and_empty_is_fine():
    names, edges = _fleet(12)
    assert gl.circular_layout(names, edges) == gl.circular_layout(list(reversed(names)), edges)
    assert gl.circular_layout([]).nodes == ()


def test_opposite_edges_bend_to_opposite_sides():
    a, b = (0.0, 1.0), (0.0, -1.0)
    there = gl.edge_curve(a, b)
    back = gl.edge_curve(b, a)
    mid_there, mid_back = there[len(there) // 2], back[len(back) // 2]
    assert mid_there[0] * mid_back[0] < 0  # one left of the chord, one right
    trimmed = gl.edge_curve(a, b, trim=0.1)
    assert all(math.hypot(x - a[0], y - a[1]) >= 0.1 for x, y in trimmed)
    assert all(math.hypot(x - b[0], y - b[1]) >= 0.1 for x, y in trimmed)


def test_edge_width_grows_with_volume_within_bounds():
    assert gl.edge_width(0, 100) == 1.5
    assert gl.edge_width(100, 100) == 10.0
    assert 1.5 < gl.edge_width(25, 100) < gl.edge_width(50, 100) < 10.0


def test_edges_from_rows_keeps_undefined_rates_undefined():
    rows = [
        {"from_agent": "a", "to_agent": "b", "volume": 3, "settled": 0, "committed": 0,
         "unknown": 0, "in_flight": 3, "p_e2e": float("nan")},
        {"from_agent": "b", "to_agent": "a", "volume": 0, "settled": 0, "committed": 0,
         "unknown": 0, "in_flight": 0, "p_e2e": float("nan")},
    ]  # fmt: skip
    (edge,) = gl.edges_from_rows(rows)
    assert edge.p_e2e is None and edge.in_flight == 3
    assert g.rate_colour(None) != g.rate_colour(0.0) != g.rate_colour(1.0)


def test_task_layers_follow_causation_ids():
    rows = [
        {"handoff_id": "h1", "created": 1, "causation_id": ""},
        {"handoff_id": "h2", "created": 2, "causation_id": "h1"},
        {"handoff_id": "h3", "created": 3, "causation_id": "h1"},
        {"handoff_id": "h4", "created": 4, "causation_id": "h3"},
    ]
    got = {n.handoff_id: (n.x, n.y, n.parent) for n in gl.task_layers(rows)}
    assert got == {"h1": (0, 0, None), "h2": (1, 0, "h1"), "h3": (1, 1, "h1"), "h4": (2, 0, "h3")}


def test_task_layers_without_causation_chain_in_created_order():
    rows = [
        {"handoff_id": "b", "created": 2},
        {"handoff_id": "a", "created": 1},
        {"handoff_id": "c", "created": 3, "causation_id": "elsewhere"},
    ]
    got = [(n.handoff_id, n.x, n.parent) for n in gl.task_layers(rows)]
    assert got == [("a", 0, None), ("b", 1, "a"), ("c", 2, "b")]


def test_task_layers_survive_a_causation_cycle():
    rows = [
        {"handoff_id": "a", "created": 1, "causation_id": "b"},
        {"handoff_id": "b", "created": 2, "causation_id": "a"},
    ]
    assert len(gl.task_layers(rows)) == 2


def test_fleet_figure_marks_unknown_edges_and_carries_the_pair():
    edges = [
        gl.Edge("a", "b", 10, 8, 6, 2, 2, 0.75),
        gl.Edge("b", "a", 2, 2, 2, 0, 0, 1.0),
        gl.Edge("a", "c", 1, 0, 0, 0, 1, None),
    ]
    layout = gl.circular_layout(["a", "b", "c"], edges)
    fig = g.fleet_figure(layout, edges)
    mids = next(t for t in fig.data if t.name == "pairs")
    assert [list(c) for c in mids.customdata] == [["a", "b"], ["b", "a"], ["a", "c"]]
    assert list(mids.marker.symbol) == ["diamond", "circle", "circle"]
    assert "bounce" in mids.hovertext[0] and "bounce" in mids.hovertext[1]
    assert "bounce" not in mids.hovertext[2]
    dashes = [t.line.dash for t in fig.data if t.mode == "lines"]
    assert dashes == ["dash", "solid", "solid"]
