"""bench/_paired.py with plain values: rounds alternate which side goes first, a failed
measurement ends the run, ratios per round and their median; and the environment that makes
a child `python -m handoffs` run another tree's code."""

from __future__ import annotations

import pytest

from bench._paired import alternate, median_ratio, round_ratio, tree_env


def test_each_side_goes_first_in_every_other_round():
    calls: list[str] = []

    def measure(side: str) -> dict:
        calls.append(side)
        return {"e2e": 100.0 if side == "this" else 80.0, "round": len(calls)}

    runs = alternate(3, ("this", "baseline"), measure)
    assert calls == ["this", "baseline", "baseline", "this", "this", "baseline"]
    assert runs is not None and len(runs) == 3
    assert [round_ratio(r, "this", "baseline", "e2e") for r in runs] == [1.25, 1.25, 1.25]


def test_a_failed_measurement_ends_the_run():
    seen: list[str] = []

    def measure(side: str) -> dict | None:
        seen.append(side)
        return None if len(seen) == 3 else {"e2e": 1.0}

    assert alternate(5, ("a", "b"), measure) is None
    assert len(seen) == 3
    with pytest.raises(ValueError, match="at least 1, got 0"):
        alternate(0, ("a", "b"), measure)


def test_the_median_of_the_rounds_ratios():
    runs = [
        {"a": {"x": 110.0}, "b": {"x": 100.0}},
        {"a": {"x": 90.0}, "b": {"x": 100.0}},
        {"a": {"x": 300.0}, "b": {"x": 100.0}},  # one disturbed round does not move it much
    ]
    assert median_ratio(runs, "a", "b", "x") == pytest.approx(1.1)
    with pytest.raises(ValueError, match="no ratio"):
        round_ratio({"a": {"x": 1.0}, "b": {"x": 0.0}}, "a", "b", "x")


def test_the_other_tree_comes_first_on_the_child_path(tmp_path):
    env = tree_env(tmp_path / "tree")
    # the working directory is not put ahead of the tree, which goes ahead of the editable
    # install of this checkout (a path finder appended after sys.path's)
    assert env == {"PYTHONPATH": str(tmp_path / "tree"), "PYTHONSAFEPATH": "1"}
