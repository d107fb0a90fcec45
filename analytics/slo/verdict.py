"""One health verdict from the SLOs' burn-rate alerts, and the top contributor to the losses.

Pure: `verdict` turns SLO evaluations (analytics.slo.burn.SloStatus, from the one rules file the
Overview, the Alerts page, `handoffs alerts check` and the weekly report all read) into
healthy / ticket / paging; `top_contributor` picks, from analytics.pairs_lost's table, the
pair that loses the most handoffs beyond the fleet's rate, and its failing stage. The dashboard, the CLI and the
report only render these, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import pandas as pd

    from analytics.slo.burn import SloStatus

__all__ = ["STAGE_WORDS", "Contributor", "Level", "Verdict", "top_contributor", "verdict"]

Level = Literal["healthy", "ticket", "paging"]

#: stage -> (the handoffs entering it, what losing one means), in funnel order
STAGE_WORDS: Final = {
    "accept": ("settled", "not accepted"),
    "execute": ("accepted", "not executed"),
    "evidence": ("executed", "without valid evidence"),
    "commit": ("evidenced", "not committed"),
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """paging when any page alert fires, else ticket when any ticket alert fires, else healthy.
    `firing`: the firing alert names (NAME:page first, then NAME:ticket, each in rule order);
    `slos`: how many SLOs were evaluated (0: no verdict can be healthy by evidence)."""

    level: Level
    firing: tuple[str, ...]
    slos: int

    @property
    def summary(self) -> str:
        """One line: "paging: triage-coder-accept:page firing" / "healthy: 4 SLOs, none firing"."""
        if self.level == "healthy":
            return f"healthy: {self.slos} SLO{'s' if self.slos != 1 else ''}, none firing"
        return f"{self.level}: {', '.join(self.firing)} firing"


def verdict(statuses: Iterable[SloStatus]) -> Verdict:
    """The verdict of a set of SLO evaluations (see Verdict)."""
    sts = tuple(statuses)
    pages = tuple(a.name for s in sts for a in s.alerts if a.firing and a.severity == "page")
    tickets = tuple(a.name for s in sts for a in s.alerts if a.firing and a.severity == "ticket")
    level: Level = "paging" if pages else "ticket" if tickets else "healthy"
    return Verdict(level=level, firing=pages + tickets, slos=len(sts))


@dataclass(frozen=True, slots=True)
class Contributor:
    """The pair and stage losing the most handoffs: `lost` of the `entered` handoffs that
    reached `stage` (accept: settled; execute: accepted; ...) were lost there."""

    from_agent: str
    to_agent: str
    stage: str
    lost: int
    entered: int

    @property
    def pair(self) -> str:
        return f"{self.from_agent}->{self.to_agent}"

    @property
    def evidence(self) -> str:
        """ "coder → billing: 33 of 33 accepted handoffs not executed"."""
        entering, lost_as = STAGE_WORDS[self.stage]
        noun = "handoff" if self.entered == 1 else "handoffs"
        return (
            f"{self.from_agent} → {self.to_agent}: {self.lost:,} of {self.entered:,} "
            f"{entering} {noun} {lost_as}"
        )


def _split(pair: str) -> tuple[str, str]:
    a, _, b = pair.partition("->")
    return a, b


def top_contributor(lost: pd.DataFrame) -> Contributor | None:
    """The (pair, stage) that loses the most handoffs beyond the fleet: the first rankable
    pair of analytics.pairs_lost.lost_by_pair's table (ranked by handoffs lost beyond the
    fleet's loss rate) that loses more than the fleet, at the stage where it loses the most;
    with none above the fleet, the rankable pair and stage losing the most. None when no
    rankable pair lost any."""
    best: Contributor | None = None
    for r in lost.to_dict(orient="records"):
        if not r["rankable"]:
            continue
        c = _best_stage(r)
        if c is not None and float(r.get("excess_lost", 0.0)) > 0:
            return c
        if c is not None and (best is None or c.lost > best.lost):
            best = c
    return best


def _best_stage(r: Mapping[str, Any]) -> Contributor | None:
    entered = int(r["settled"])
    best: Contributor | None = None
    frm, to = (
        (str(r["from_agent"]), str(r["to_agent"])) if "from_agent" in r else _split(str(r["pair"]))
    )
    for stage in STAGE_WORDS:
        n = int(r[f"lost_{stage}"])
        if n > 0 and (best is None or n > best.lost):
            best = Contributor(frm, to, stage, n, entered)
        entered -= n  # the next stage sees what passed this one
    return best
