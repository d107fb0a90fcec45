"""analytics.pairs_lost.lost_by_pair on plain funnel counts: lost per stage, the failing
stage, the minimum sample, the order."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analytics.pairs_lost import MIN_N, lost_by_pair


def _row(pair: str, settled: int, accepted: int, executed: int, evidenced: int, committed: int):
    return {
        "pair": pair,
        "settled": settled,
        "accepted": accepted,
        "executed": executed,
        "evidenced": evidenced,
        "committed": committed,
    }


FRAME = pd.DataFrame(
    [
        _row("planner->coder", 120, 118, 117, 110, 110),
        _row("coder->billing", 33, 33, 0, 0, 0),
        _row("a->b", 2, 0, 0, 0, 0),
        _row("support->billing", 40, 40, 40, 40, 40),
    ]
)


def test_a_pair_losing_every_handoff_at_execute_is_the_worst():
    out = lost_by_pair(FRAME)
    top = out.iloc[0]
    assert top["pair"] == "coder->billing"
    assert (top["lost"], top["lost_accept"], top["lost_execute"]) == (33, 0, 33)
    assert top["failing_stage"] == "execute" and bool(top["rankable"])
    assert top["p_accept"] == 1.0 and top["p_execute"] == 0.0
    assert math.isnan(top["p_evidence"])  # nothing executed: undefined, not 0


def test_two_handoffs_at_zero_percent_are_listed_but_not_rankable():
    out = lost_by_pair(FRAME).set_index("pair")
    small = out.loc["a->b"]
    assert small["lost"] == 2 and small["failing_stage"] == "accept"
    assert not small["rankable"] and small["p_e2e"] == 0.0
    worst_rankable = lost_by_pair(FRAME).query("rankable")["pair"].tolist()
    assert worst_rankable[0] == "coder->billing"


def test_losses_add_up_and_the_order_is_by_handoffs_lost_beyond_the_fleet():
    out = lost_by_pair(FRAME)
    # rankable pairs first, by handoffs lost beyond the fleet's rate: planner->coder loses 10
    # of 120, less than the fleet's rate would (27.7), so it comes after a pair losing none
    # of 40 (9.2 expected); then the small samples
    assert out["pair"].tolist() == ["coder->billing", "support->billing", "planner->coder", "a->b"]
    pc = out.set_index("pair").loc["planner->coder"]
    assert [pc[f"lost_{s}"] for s in ("accept", "execute", "evidence", "commit")] == [2, 1, 7, 0]
    assert pc["lost"] == 10 and pc["failing_stage"] == "evidence"
    # the fleet loses 45 of 195: a large pair losing at that rate has no excess
    fleet = 45 / 195
    assert pc["excess_lost"] == pytest.approx(10 - 120 * fleet)
    assert out.set_index("pair").loc["coder->billing", "excess_lost"] == pytest.approx(
        33 - 33 * fleet
    )
    clean = out.set_index("pair").loc["support->billing"]
    assert clean["lost"] == 0 and clean["failing_stage"] == ""


def test_min_n_and_ties():
    assert MIN_N == 20
    out = lost_by_pair(FRAME, min_n=2).set_index("pair")
    assert out.loc["a->b", "rankable"]
    tie = lost_by_pair(pd.DataFrame([_row("x->y", 30, 25, 20, 20, 20)]))
    assert tie.iloc[0]["failing_stage"] == "accept"  # 5 and 5: the earlier stage
    for bad in (-1, 2.5, True, "20", None):
        with pytest.raises(ValueError, match="min_n"):
            lost_by_pair(FRAME, min_n=bad)  # type: ignore[arg-type]


def test_agent_columns_rows_summed_and_missing_columns():
    split = pd.DataFrame(
        [
            {**_row("", 10, 10, 0, 0, 0), "from_agent": "coder", "to_agent": "billing"},
            {**_row("", 23, 23, 0, 0, 0), "from_agent": "coder", "to_agent": "billing"},
        ]
    ).drop(columns="pair")
    out = lost_by_pair(split)
    assert len(out) == 1
    assert out.iloc[0][["pair", "from_agent", "to_agent", "lost"]].tolist() == [
        "coder->billing",
        "coder",
        "billing",
        33,
    ]
    with pytest.raises(ValueError, match="executed"):
        lost_by_pair(FRAME.drop(columns="executed"))
    with pytest.raises(ValueError, match="pair"):
        lost_by_pair(FRAME.drop(columns="pair"))
    empty = lost_by_pair(FRAME.iloc[0:0])
    assert empty.empty and "failing_stage" in empty.columns
