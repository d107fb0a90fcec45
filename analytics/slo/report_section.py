"""The weekly report's SLO section: the rules file's SLOs over the week, and the verdict.

The targets are the rules file's (analytics.slo.burn.rules_file: the one the dashboard and
`handoffs alerts check` read), never a list of the report's own. Each SLO's actual is its
objective over the week's cohort in the rule's scope; "breached" compares the unrounded
good fraction with the target and prints the actual with the digits that show why
(analytics.slo.burn.fmt_vs_target). The verdict is the burn-rate alerts' at the week's end (or
at `as_of` when that is earlier), as the Overview and the Alerts page would show it then.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from analytics.slo._rules import RATIO_OBJECTIVES
from analytics.slo.burn import Counts, Rule, SloStatus, budget_text, fmt_vs_target
from analytics.slo.verdict import Verdict, verdict

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from analytics._sql.cohort import Window

__all__ = ["SloRow", "SloSection", "html_section", "md_lines", "slo_rows", "slo_section"]

Status = Literal["met", "breached", "no data"]


@dataclass(frozen=True, slots=True)
class SloRow:
    """One SLO over the week: `counts` of its objective, status against `rule.target`, and its
    evaluation at the verdict time (budget, alerts)."""

    rule: Rule
    counts: Counts
    status: Status
    evaluation: SloStatus | None = None

    @property
    def good(self) -> float | None:
        """The fraction of good events over the week (what `target` bounds); None without."""
        f = self.counts.bad_fraction
        return None if f is None else 1.0 - f

    @property
    def ceiling(self) -> bool:
        """A rate objective (unknown_rate, anomaly:KIND): shown as a maximum rate."""
        return self.rule.objective not in RATIO_OBJECTIVES

    @property
    def target_text(self) -> str:
        t = self.rule.target
        return f"≤ {100 * (1 - t):g}%" if self.ceiling else f"≥ {100 * t:g}%"

    @property
    def actual_text(self) -> str:
        """The week's value, with enough digits to tell it from the target."""
        g = self.good
        if g is None:
            return "—"
        t = self.rule.target
        return fmt_vs_target(1 - g, 1 - t) if self.ceiling else fmt_vs_target(g, t)

    @property
    def scope(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.rule.where) or "all"


def _status(counts: Counts, target: float) -> Status:
    f = counts.bad_fraction
    if f is None:
        return "no data"
    return "breached" if 1.0 - f < target else "met"


def slo_rows(
    rules: Sequence[Rule], counts: Sequence[Counts], evaluations: Sequence[SloStatus] = ()
) -> list[SloRow]:
    """Each rule with its week's counts (same order) and evaluation (same order, optional):
    breached when the unrounded good fraction is below the target, "no data" without events."""
    evs: list[SloStatus | None] = list(evaluations) or [None] * len(rules)
    return [
        SloRow(r, c, _status(c, r.target), e) for r, c, e in zip(rules, counts, evs, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class SloSection:
    rows: tuple[SloRow, ...]
    verdict: Verdict
    at: datetime


def slo_section(
    client: Client, rules: Sequence[Rule], *, week: Window, database: str
) -> SloSection:
    """The rules over the week's cohort, and the burn-rate verdict at the week's end (at its
    clock when that is earlier)."""
    from analytics.slo.store import cohort_counts, evaluate_rules

    at = min(week.end, week.clock())
    evaluations = evaluate_rules(client, rules, as_of=at, database=database)
    counts = [cohort_counts(client, r, window=week, database=database) for r in rules]
    return SloSection(tuple(slo_rows(rules, counts, evaluations)), verdict(evaluations), at)


def _budget(r: SloRow) -> str:
    return budget_text(r.evaluation.budget_remaining) if r.evaluation else "—"


def md_lines(s: SloSection, source: str) -> list[str]:
    """The Markdown SLO section."""
    return [
        "## SLO status",
        f"Verdict at {s.at:%Y-%m-%d %H:%M} UTC: **{s.verdict.summary}**. Targets from "
        f"`{source}`; actual over this week's settled handoffs.",
        "",
        "| SLO | objective | scope | target | actual | status | budget left |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.rule.name} | {r.rule.objective} | {r.scope} | {r.target_text} | "
            f"{r.actual_text} | {r.status} | {_budget(r)} |"
            for r in s.rows
        ),
    ]


def html_section(s: SloSection, source: str) -> str:
    """The HTML SLO section."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(r.rule.name)}</td><td>{e(r.rule.objective)}</td><td>{e(r.scope)}</td>"
        f"<td>{e(r.target_text)}</td><td>{e(r.actual_text)}</td>"
        f"<td class='{r.status.replace(' ', '-')}'>{r.status}</td><td>{e(_budget(r))}</td></tr>"
        for r in s.rows
    )
    return (
        f"<h2>SLO status</h2><p>Verdict at {s.at:%Y-%m-%d %H:%M} UTC: "
        f"<strong>{e(s.verdict.summary)}</strong>. Targets from <code>{e(source)}</code>; "
        "actual over this week's settled handoffs.</p><table><thead><tr><th>SLO</th>"
        "<th>objective</th><th>scope</th><th>target</th><th>actual</th><th>status</th>"
        f"<th>budget left</th></tr></thead><tbody>{rows}</tbody></table>"
    )
