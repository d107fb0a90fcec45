"""The verdict (SLO statuses -> healthy / ticket / paging), the top contributor, and the two
ways SLO numbers are printed (an exhausted budget, an actual next to its target), with plain
values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd

from analytics.slo.burn import Counts, Rule, budget_text, evaluate, fmt_vs_target
from analytics.slo.report_section import slo_rows
from analytics.slo.verdict import Contributor, top_contributor, verdict

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _status(name: str, bad: dict[timedelta, float], target: float = 0.9):
    rule = Rule(name=name, objective="p_e2e", target=target)
    counts = {w: Counts(1000, round(1000 * bad.get(w, 0.0))) for w in rule.windows()}
    return evaluate(rule, counts, as_of=AT)


def _all(frac: float) -> dict[timedelta, float]:
    rule = Rule(name="x", objective="p_e2e", target=0.9)
    return dict.fromkeys(rule.windows(), frac)


def test_verdict_is_healthy_ticket_or_paging_from_the_alert_states():
    quiet = _status("quiet", _all(0.01))
    slow = _status("slow", _all(0.15))  # burn 1.5: the 3d/6h ticket pair only
    fast = _status("fast", _all(0.9))  # burn 9: the 6h/30m page pair
    assert verdict([]).level == "healthy" and verdict([]).slos == 0
    assert verdict([quiet]).summary == "healthy: 1 SLO, none firing"
    assert verdict([quiet, slow]).level == "ticket"
    assert verdict([quiet, slow]).firing == ("slow:ticket",)
    v = verdict([slow, fast, quiet])
    assert v.level == "paging" and v.firing == ("fast:page", "slow:ticket", "fast:ticket")
    assert v.summary == "paging: fast:page, slow:ticket, fast:ticket firing"


def test_budget_reads_exhausted_with_its_burn_not_a_negative_percentage():
    assert budget_text(0.42) == "42.0%"
    assert budget_text(-226.0) == "exhausted (burn 227×)"
    assert budget_text(-0.5) == "exhausted (burn 1.5×)"
    assert budget_text(0.0) == "exhausted (burn 1.0×)"
    assert budget_text(None) == "—"
    st = _status("burnt", _all(0.9), target=0.996)  # 90% bad of a 0.4% budget: 225x
    assert budget_text(st.budget_remaining) == "exhausted (burn 225×)"


def test_an_actual_just_below_its_target_is_breached_and_printed_to_show_why():
    assert fmt_vs_target(0.9496, 0.95) == "94.96%"
    assert fmt_vs_target(0.94999, 0.95) == "94.999%"
    assert fmt_vs_target(0.95, 0.95) == "95.0%"
    assert fmt_vs_target(0.8, 0.95) == "80.0%"
    accept = Rule(name="accept", objective="p_accept", target=0.95)
    unknown = Rule(name="unknown", objective="unknown_rate", target=0.95)
    rows = slo_rows(
        [accept, accept, unknown, unknown],
        [Counts(10_000, 504), Counts(100, 5), Counts(10_000, 504), Counts(0, 0)],
    )
    assert [r.status for r in rows] == ["breached", "met", "breached", "no data"]
    assert rows[0].actual_text == "94.96%" and rows[0].target_text == "≥ 95%"
    assert rows[1].actual_text == "95.0%"
    assert rows[2].actual_text == "5.04%" and rows[2].target_text == "≤ 5%"


def _lost(rows: list[dict]) -> pd.DataFrame:
    base = {"lost_accept": 0, "lost_execute": 0, "lost_evidence": 0, "lost_commit": 0}
    return pd.DataFrame([{**base, "rankable": True, **r} for r in rows])


def test_top_contributor_is_the_pair_and_stage_losing_the_most():
    df = _lost(
        [
            {"pair": "planner->coder", "settled": 500, "lost_accept": 20, "lost_execute": 25},
            {"pair": "coder->billing", "settled": 33, "lost_execute": 33},
            {"pair": "a->b", "settled": 3, "lost_accept": 3, "rankable": False},
        ]
    )
    c = top_contributor(df)
    assert c == Contributor("coder", "billing", "execute", 33, 33)
    assert c.evidence == "coder → billing: 33 of 33 accepted handoffs not executed"
    planner = top_contributor(df.iloc[[0]])
    assert planner is not None and planner.evidence == (
        "planner → coder: 25 of 480 accepted handoffs not executed"
    )
    assert top_contributor(_lost([{"pair": "a->b", "settled": 40}])) is None
    assert top_contributor(df.iloc[[2]]) is None  # too few settled to be called worst
