"""The pure parts of the outcome counts and refusals: the outcome columns roll up as sums,
refusal codes fold per event, events are checked."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analytics._sql.cohort import DIMENSIONS
from analytics.refusals import REFUSAL_EVENTS, check_events, group_refusals
from analytics.rollup import COUNT_COLUMNS, OUTCOME_COLUMNS, OUTCOMES, outcomes, rollup


def test_outcome_columns_are_counts_that_roll_up():
    assert set(OUTCOME_COLUMNS) <= set(COUNT_COLUMNS)
    rows = pd.DataFrame(
        [
            {"mode": "a", **dict.fromkeys(COUNT_COLUMNS, 1), "outcome_failed": 2},
            {"mode": "b", **dict.fromkeys(COUNT_COLUMNS, 1), "outcome_failed": 3},
        ]
    )
    total = rollup(rows).iloc[0]
    assert outcomes(total) == {**dict.fromkeys(OUTCOMES, 2), "failed": 5}


def test_contract_version_is_a_dimension():
    assert "contract_version" in DIMENSIONS


def test_check_events():
    assert check_events(None) == REFUSAL_EVENTS
    assert check_events("") == REFUSAL_EVENTS
    assert check_events("timeout, reject") == ("reject", "timeout")  # contract order
    with pytest.raises(ValueError, match="commit"):
        check_events(["reject", "commit"])


def test_group_refusals_folds_codes_per_event():
    rows = [
        (None, "reject", "busy", 2, ["h2", "h1"]),
        (None, "reject", "made_up", 1, ["h3"]),
        (None, "reject", "", 1, ["h4"]),
        (None, "fail", "busy", 1, ["h5"]),
    ]
    got = group_refusals(rows, {None: 10}, examples=1)
    assert [(r.event, r.error_code, r.count, r.examples) for r in got] == [
        ("reject", "busy", 2, ("h1",)),
        ("reject", "other", 2, ("h3",)),
        ("fail", "busy", 1, ("h5",)),
    ]
    other = got[1]
    assert other.raw_codes == ("", "made_up")
    assert other.share_of_event == pytest.approx(2 / 4) and got[2].share_of_event == 1.0
    assert other.share_of_handoffs == pytest.approx(2 / 10)
    lonely = group_refusals([("g", "cancel", "", 1, ["h"])], {}, examples=3)
    assert math.isnan(lonely[0].share_of_handoffs)  # an unknown group size: undefined
    assert lonely[0].to_dict("mode")["mode"] == "g"
    with pytest.raises(ValueError):
        group_refusals([], {}, examples=-1)
