"""The explorer's swimlane: transition labels stay readable when transitions are close in time.

Checked on the figure itself: its label annotations, turned into pixel boxes for the plot
width the figure is laid out for, must not overlap.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dashboard import _charts as charts
from dashboard._graph_layout import boxes_overlap

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def _run(steps, *, gap: timedelta) -> list[dict]:
    return [
        {"actor": actor, "event": ev, "to_state": to, "time": (T0 + i * gap).isoformat()}
        for i, (actor, ev, to) in enumerate(steps)
    ]


#: An OpenAI Agents SDK handoff: every transition within a few milliseconds, one actor
SDK_RUN = [
    ("triage", "create", "created"),
    ("billing", "accept", "accepted"),
    ("billing", "start", "running"),
    ("billing", "commit", "committed"),
    ("billing", "verify", "verified"),
]


def _collisions(fig) -> list[tuple[str, str]]:
    boxes = charts.swimlane_label_boxes(fig)
    return [
        (a, b)
        for i, (a, ba) in enumerate(boxes)
        for b, bb in boxes[i + 1 :]
        if boxes_overlap(ba, bb)
    ]


def test_millisecond_transitions_get_labels_that_do_not_overlap():
    fig = charts.timeline_figure(_run(SDK_RUN, gap=timedelta(milliseconds=1)))
    boxes = charts.swimlane_label_boxes(fig)
    assert len(boxes) == len(SDK_RUN)
    assert not _collisions(fig)


def test_close_transitions_next_to_a_slow_one_do_not_overlap():
    # the quick ones bunch up at one end of an axis stretched by a slow timeout
    run = _run(SDK_RUN[:3], gap=timedelta(milliseconds=2))
    run.append(
        {"actor": "triage", "event": "timeout", "to_state": "unknown",
         "time": (T0 + timedelta(minutes=5)).isoformat()}
    )  # fmt: skip
    fig = charts.timeline_figure(run)
    assert not _collisions(fig)


def test_labels_keep_the_machine_order():
    fig = charts.timeline_figure(_run(SDK_RUN, gap=timedelta(milliseconds=1)))
    texts = [text for text, _box in charts.swimlane_label_boxes(fig)]
    assert [t.split(" ", 1)[0] for t in texts] == ["1", "2", "3", "4", "5"]
    assert "commit → committed" in texts[3]


def test_spread_out_transitions_stay_on_the_first_row():
    fig = charts.timeline_figure(_run(SDK_RUN, gap=timedelta(minutes=1)))
    shifts = {abs(a.yshift) for a in fig.layout.annotations}
    assert len(shifts) == 1  # one row above or below: nothing had to be stacked
    assert not _collisions(fig)
