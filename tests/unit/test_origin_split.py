"""analytics.origin.split_shim: the shim's counts are the cohort's minus the other origins'."""

from __future__ import annotations

from analytics.origin import ORIGIN_COUNTS, split_shim


def _row(origin: str, volume: int, settled: int) -> dict:
    return {"origin": origin, **dict.fromkeys(ORIGIN_COUNTS, 0), "volume": volume,
            "settled": settled}  # fmt: skip


def test_the_shim_is_the_cohort_minus_the_other_origins():
    got = split_shim([_row("", 10, 8), _row("derived:adk", 3, 2), _row("adapter:openai", 1, 1)])
    assert [(r["origin"], r["volume"], r["settled"]) for r in got] == [
        ("adapter:openai", 1, 1),
        ("derived:adk", 3, 2),
        ("shim", 6, 5),
    ]


def test_origins_without_handoffs_are_left_out():
    assert [r["origin"] for r in split_shim([_row("", 3, 3), _row("derived:x", 3, 3)])] == [
        "derived:x"
    ]
    assert split_shim([_row("", 0, 0)]) == []
    assert split_shim([]) == []
