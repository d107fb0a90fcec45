"""Service-level objectives over the handoff metrics, and multi-window multi-burn-rate alerts.

Pure: rules are frozen dataclasses (parsed from YAML by `load_rules` / `parse_rules`, schema
in docs/alerts.md); `evaluate` turns per-window event counts into burn rates, firing alerts
and the remaining error budget; `decide` turns the previous notification state and a new
evaluation into the next state and the notifications to send. Reading counts from the store
is analytics.slo.store; the webhook loop is analytics._cli.watch.

Convention: `target` is always the fraction of events that must be good, so the allowed bad
fraction is `1 - target`. For a ratio objective (p_accept .. p_e2e) a bad event is a handoff
in the ratio's denominator that is not in its numerator; for a rate objective (unknown_rate,
escalation_rate, anomaly:KIND) a bad event is one the rate counts. `target: 0.995` on
unknown_rate means at most 0.5% of settled handoffs may enter `unknown`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final, Literal

from analytics.slo._rules import (
    ANOMALY_PREFIX,
    RATE_OBJECTIVES,
    RATIO_OBJECTIVES,
    RuleModel,
    RulesError,
    fmt_duration,
    parse,
    parse_duration,
)
from foundation import settings

__all__ = [
    "DEFAULT_RULES_PATH",
    "PAGE_TICKET_30D",
    "RATE_OBJECTIVES",
    "RATIO_OBJECTIVES",
    "SLO_RULES",
    "SLO_WINDOW_30D",
    "AlertState",
    "AlertStatus",
    "BurnWindow",
    "Counts",
    "Notification",
    "PairStatus",
    "Rule",
    "RulesError",
    "SloStatus",
    "budget_remaining",
    "budget_text",
    "burn_rate",
    "decide",
    "default_burn_windows",
    "evaluate",
    "fmt_duration",
    "fmt_vs_target",
    "load_rules",
    "notification_body",
    "objective_counts",
    "parse_duration",
    "parse_rules",
    "rules_file",
]

#: The rules file the dashboard's Alerts page reads when none is given.
SLO_RULES: Final = settings.SLO_RULES
DEFAULT_RULES_PATH: Final = SLO_RULES.default

Severity = Literal["page", "ticket"]
SEVERITIES: Final = ("page", "ticket")

SLO_WINDOW_30D: Final = timedelta(days=30)
#: The Google SRE workbook's table for a 30-day SLO: (severity, long, short, burn factor).
#: A factor f over a long window L spends f * L / 30d of the budget (14.4 x 1 h = 2%).
PAGE_TICKET_30D: Final = (
    ("page", timedelta(hours=1), timedelta(minutes=5), 14.4),
    ("page", timedelta(hours=6), timedelta(minutes=30), 6.0),
    ("ticket", timedelta(days=1), timedelta(hours=2), 3.0),
    ("ticket", timedelta(days=3), timedelta(hours=6), 1.0),
)


@dataclass(frozen=True, slots=True)
class BurnWindow:
    """One window pair: alert when the burn rate over both `long` and `short` exceeds `factor`."""

    severity: Severity
    long: timedelta
    short: timedelta
    factor: float

    @property
    def label(self) -> str:
        return f"{fmt_duration(self.long)}/{fmt_duration(self.short)}"


def default_burn_windows(window: timedelta) -> tuple[BurnWindow, ...]:
    """The workbook's four pairs scaled by window / 30d (whole seconds, at least 1 s);
    the factors stay: each pair still spends the same fraction of the budget."""
    scale = window / SLO_WINDOW_30D

    def scaled(d: timedelta) -> timedelta:
        return timedelta(seconds=max(1, round(d.total_seconds() * scale)))

    return tuple(
        BurnWindow(sev, scaled(long), scaled(short), f)  # type: ignore[arg-type]
        for sev, long, short, f in PAGE_TICKET_30D
    )


@dataclass(frozen=True, slots=True)
class Rule:
    """One SLO: objective (p_*, unknown_rate, escalation_rate or anomaly:KIND), target (the good
    fraction, 0 < target < 1), window, scope `where` ((dimension, value) pairs of
    analytics.DIMENSIONS), burn windows, and the line of the rule in its file."""

    name: str
    objective: str
    target: float
    window: timedelta = SLO_WINDOW_30D
    where: tuple[tuple[str, str], ...] = ()
    burn_windows: tuple[BurnWindow, ...] = ()
    description: str = ""
    line: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.target < 1.0:
            raise ValueError(f"target must be strictly between 0 and 1, got {self.target}")
        if not self.burn_windows:
            object.__setattr__(self, "burn_windows", default_burn_windows(self.window))

    @property
    def allowed_bad(self) -> float:
        """The fraction of events allowed to be bad: 1 - target."""
        return 1.0 - self.target

    @property
    def anomaly_kind(self) -> str | None:
        return (
            self.objective[len(ANOMALY_PREFIX) :]
            if self.objective.startswith(ANOMALY_PREFIX)
            else None
        )

    def windows(self) -> tuple[timedelta, ...]:
        """Every window length the evaluation needs counts for, shortest first."""
        ws = {self.window}
        for b in self.burn_windows:
            ws.update((b.long, b.short))
        return tuple(sorted(ws))


@dataclass(frozen=True, slots=True)
class Counts:
    """Events in one window: `total` eligible handoffs, `bad` of them bad."""

    total: int
    bad: int

    @property
    def bad_fraction(self) -> float | None:
        """bad / total, None when there were no events (undefined, never 0)."""
        return self.bad / self.total if self.total else None


def objective_counts(objective: str, row: Mapping[str, float]) -> Counts:
    """Counts of an objective from a funnel row (count columns of analytics.metrics): ratio
    objectives are den - num bad of den; rate objectives num bad of den. Anomaly objectives
    need `anomalous` (handoffs flagged) of `volume`. ValueError for an unknown objective."""
    from analytics.metrics import RATES

    if objective.startswith(ANOMALY_PREFIX):
        return Counts(total=int(row["volume"]), bad=int(row["anomalous"]))
    if objective not in RATES:
        raise ValueError(f"unknown objective {objective!r}")
    num, den = RATES[objective]
    n, d = int(row[num]), int(row[den])
    if objective in RATIO_OBJECTIVES:
        return Counts(total=d, bad=d - n)
    return Counts(total=d, bad=n)


def burn_rate(counts: Counts, target: float) -> float | None:
    """How fast the budget burns: bad fraction / (1 - target); 1.0 spends exactly the budget
    over the SLO window. None without events."""
    f = counts.bad_fraction
    return None if f is None else f / (1.0 - target)


def budget_remaining(counts: Counts, target: float) -> float | None:
    """1 - bad fraction / allowed bad fraction over the SLO window: 1.0 untouched, 0 spent,
    negative overspent. None without events."""
    b = burn_rate(counts, target)
    return None if b is None else 1.0 - b


@dataclass(frozen=True, slots=True)
class PairStatus:
    window: BurnWindow
    long_burn: float | None
    short_burn: float | None

    @property
    def firing(self) -> bool:
        """Both burn rates defined and above the factor (strictly, as the workbook's `>`)."""
        return (
            self.long_burn is not None
            and self.short_burn is not None
            and self.long_burn > self.window.factor
            and self.short_burn > self.window.factor
        )


@dataclass(frozen=True, slots=True)
class AlertStatus:
    """One alert: an SLO at one severity, firing when any of its window pairs fires."""

    slo: str
    severity: Severity
    pairs: tuple[PairStatus, ...]

    @property
    def name(self) -> str:
        return f"{self.slo}:{self.severity}"

    @property
    def firing(self) -> bool:
        return any(p.firing for p in self.pairs)

    @property
    def hold(self) -> timedelta:
        """The shortest short window: the least time between two notifications of this alert."""
        return min(p.window.short for p in self.pairs)


@dataclass(frozen=True, slots=True)
class SloStatus:
    rule: Rule
    as_of: datetime
    counts: tuple[tuple[timedelta, Counts], ...]
    budget_remaining: float | None
    alerts: tuple[AlertStatus, ...]

    @property
    def firing(self) -> bool:
        return any(a.firing for a in self.alerts)

    def count(self, window: timedelta) -> Counts:
        return dict(self.counts)[window]


def evaluate(rule: Rule, counts: Mapping[timedelta, Counts], *, as_of: datetime) -> SloStatus:
    """Burn rates of every window pair, alerts per severity and the budget remaining, from
    the counts of each window in rule.windows() ending at as_of. KeyError for a missing one."""
    pairs = [
        PairStatus(
            b, burn_rate(counts[b.long], rule.target), burn_rate(counts[b.short], rule.target)
        )
        for b in rule.burn_windows
    ]
    alerts = tuple(
        AlertStatus(rule.name, sev, tuple(p for p in pairs if p.window.severity == sev))  # type: ignore[arg-type]
        for sev in SEVERITIES
        if any(p.window.severity == sev for p in pairs)
    )
    return SloStatus(
        rule=rule,
        as_of=as_of,
        counts=tuple((w, counts[w]) for w in rule.windows()),
        budget_remaining=budget_remaining(counts[rule.window], rule.target),
        alerts=alerts,
    )


# --------------------------------------------------------------------- notifications


@dataclass(frozen=True, slots=True)
class AlertState:
    """What was last notified for one alert: firing or not, and when."""

    firing: bool
    notified_at: datetime


@dataclass(frozen=True, slots=True)
class Notification:
    state: Literal["firing", "resolved"]
    alert: AlertStatus
    status: SloStatus


def decide(
    previous: Mapping[str, AlertState], statuses: Sequence[SloStatus], *, as_of: datetime
) -> tuple[dict[str, AlertState], tuple[Notification, ...]]:
    """The next notification state and what to send, from the last one and a new evaluation.

    An alert is notified when it starts firing and when it stops (resolved; an alert never
    notified firing is not resolved). Nothing while it stays as notified (no repeats), and
    never twice within the alert's shortest short window (`AlertStatus.hold`): a change
    inside it waits for a later evaluation. Alerts no longer evaluated are dropped.
    """
    state: dict[str, AlertState] = {}
    out: list[Notification] = []
    for st in statuses:
        for alert in st.alerts:
            prev = previous.get(alert.name)
            was_firing = prev.firing if prev else False
            if alert.firing == was_firing or (
                prev is not None and as_of - prev.notified_at < alert.hold
            ):
                if prev is not None:
                    state[alert.name] = prev
                continue
            state[alert.name] = AlertState(firing=alert.firing, notified_at=as_of)
            out.append(Notification("firing" if alert.firing else "resolved", alert, st))
    return state, tuple(out)


def _x(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{v:.1f}×"


def budget_text(remaining: float | None) -> str:
    """The error budget remaining as a reader takes it: "42.0%" while some is left,
    "exhausted (burn 227×)" once it is spent (the burn over the SLO window, 1 - remaining,
    instead of a negative percentage), "—" without events."""
    if remaining is None or math.isnan(remaining):
        return "—"
    if remaining > 0:
        return f"{100 * remaining:.1f}%"
    burn = 1.0 - remaining
    return f"exhausted (burn {burn:.1f}×)" if burn < 10 else f"exhausted (burn {burn:.0f}×)"


def fmt_vs_target(actual: float, target: float, *, digits: int = 1, most: int = 4) -> str:
    """`actual` (a fraction) as a percentage with `digits` decimals, more (up to `most`) while
    it would print the same as `target`: 0.9496 against 0.95 is "94.96%", never a "95.0%"
    that reads as met. Equal values print with `digits`."""
    d = digits
    while d < most and actual != target and f"{100 * actual:.{d}f}" == f"{100 * target:.{d}f}":
        d += 1
    return f"{100 * actual:.{d}f}%"


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def notification_body(n: Notification) -> dict[str, object]:
    """The webhook JSON: a Slack-compatible `text` plus the structured fields (burn rates are
    multiples of the budget rate; budget_remaining a fraction, None without events)."""
    rule, alert = n.status.rule, n.alert
    pairs = alert.pairs
    burns = ", ".join(
        f"{_x(p.long_burn)} over {fmt_duration(p.window.long)} and {_x(p.short_burn)} over "
        f"{fmt_duration(p.window.short)} (threshold {p.window.factor:g}×)"
        for p in pairs
    )
    scope = ", ".join(f"{k}={v}" for k, v in rule.where)
    head = "[FIRING]" if n.state == "firing" else "[RESOLVED]"
    text = (
        f"{head} {alert.name}: {rule.objective}{f' ({scope})' if scope else ''} burn rate "
        f"{burns}; error budget remaining {budget_text(n.status.budget_remaining)} "
        f"(target {100 * rule.target:g}% over {fmt_duration(rule.window)})"
    )
    return {
        "text": text,
        "alert": alert.name,
        "slo": rule.name,
        "objective": rule.objective,
        "where": dict(rule.where),
        "severity": alert.severity,
        "state": n.state,
        "as_of": _iso(n.status.as_of),
        "target": rule.target,
        "window": fmt_duration(rule.window),
        "budget_remaining": n.status.budget_remaining,
        "burn_rates": [
            {
                "long": fmt_duration(p.window.long),
                "short": fmt_duration(p.window.short),
                "factor": p.window.factor,
                "long_burn": p.long_burn,
                "short_burn": p.short_burn,
                "firing": p.firing,
            }
            for p in pairs
        ],
        "windows": [p.window.label for p in pairs],
    }


def _rule(m: RuleModel, line: int) -> Rule:
    return Rule(
        name=m.name,
        objective=m.objective,
        target=float(m.target),
        window=m.window,
        where=tuple(sorted(m.where.items())),
        burn_windows=tuple(
            BurnWindow(b.severity, b.long, b.short, b.factor) for b in m.burn_rates or ()
        ),
        description=m.description,
        line=line,
    )


def parse_rules(text: str, *, path: str = "<rules>") -> tuple[Rule, ...]:
    """Rules from YAML text (schema: docs/alerts.md). RulesError with every line and reason."""
    return tuple(_rule(m, line) for m, line in parse(text, path=path))


def rules_file(given: str | None = None) -> Path:
    """The SLO rules file every reader uses (dashboard, `alerts check`, `watch`, the weekly
    report): `given`, else HANDOFFS_SLO_RULES, else deploy/slos.yaml of the working directory
    or, when there is none, of the source tree this package runs from. May not exist."""
    chosen = settings.resolve(SLO_RULES, given)
    path = Path(chosen).expanduser()
    if chosen == SLO_RULES.default and not path.is_file():
        path = Path(__file__).resolve().parents[2] / chosen  # run outside the source tree
    return path


def load_rules(path: str) -> tuple[Rule, ...]:
    """Rules from a YAML file. RulesError (line 0) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesError(path, [(0, f"cannot read the rules file: {exc}")]) from None
    return parse_rules(text, path=path)
