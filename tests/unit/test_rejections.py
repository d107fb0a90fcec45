"""analytics.rejections.group_codes: the vocabulary, `other`, shares and examples."""

from __future__ import annotations

import math

import pytest

from analytics.rejections import Rejection, group_codes


def test_codes_outside_the_vocabulary_are_other_with_their_raw_codes():
    rows = [
        (None, "busy", 3, ["h3", "h1", "h2"]),
        (None, "grant_expired", 1, ["h9"]),
        (None, "teapot", 1, ["h7"]),
        (None, "", 2, ["h5", "h4"]),
    ]
    got = group_codes(rows, {None: 20}, examples=2)
    assert got == [
        Rejection("busy", 3, 3 / 7, 3 / 20, ("h1", "h2"), ("busy",)),
        Rejection("other", 3, 3 / 7, 3 / 20, ("h4", "h5"), ("", "teapot")),
        Rejection("grant_expired", 1, 1 / 7, 1 / 20, ("h9",), ("grant_expired",)),
    ]
    assert got[1].to_dict()["raw_codes"] == ["", "teapot"]


def test_groups_have_their_own_denominators():
    rows = [("a", "busy", 1, ["x"]), ("b", "busy", 2, ["y", "z"]), ("b", "conflict", 2, ["w"])]
    got = group_codes(rows, {"a": 4}, examples=5)
    assert [(r.group, r.error_code, r.count) for r in got] == [
        ("a", "busy", 1),
        ("b", "busy", 2),
        ("b", "conflict", 2),
    ]
    assert got[0].share_of_settled == pytest.approx(0.25)
    assert math.isnan(got[1].share_of_settled)  # no settled count for b: undefined, not 0
    assert got[1].share_of_rejections == pytest.approx(0.5)
    assert got[1].to_dict("to_agent")["to_agent"] == "b"


def test_nothing_rejected_and_bad_examples():
    assert group_codes([], {None: 3}) == []
    with pytest.raises(ValueError, match="examples"):
        group_codes([], {}, examples=-1)
