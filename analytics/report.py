"""The weekly reliability report: one self-contained HTML file (SVG charts, no script) or
Markdown, over the last 7 days (default) or one ISO week.

Built only from the public loaders (funnel, latencies, anomalies, handoffs_behind), so the
report shows exactly the numbers the dashboard and `handoffs metrics` show; the outcome
counts are the funnel's outcome_* columns of the same split.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from analytics import _report_charts as charts
from analytics._report_window import ReportWindow, parse_week, report_window
from analytics._sql.cohort import Window, check_db
from analytics.anomaly_kinds import anomalies
from analytics.display import html_safe
from analytics.keyless import keyless_writes
from analytics.metrics import RATE_COLUMNS, funnel, handoffs_behind, latencies
from analytics.pairs_lost import LOST_STAGES, MIN_N, lost_by_pair
from analytics.rollup import OUTCOMES, rollup
from analytics.slo.burn import load_rules, rules_file
from analytics.slo.report_section import html_section, md_lines, slo_section
from foundation.units import fmt_duration_ms

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from analytics.slo.burn import Rule

__all__ = [
    "default_week",
    "fmt_rate",
    "parse_week",
    "report_window",
    "weekly_report",
]

#: Worst agent pairs listed: ranked by handoffs lost beyond the fleet's rate, pairs with at
#: least MIN_N settled.
WORST_PAIRS: Final = 10


def default_week(now: datetime | None = None) -> str:
    """The last full ISO week before `now` (default the current time), as 'YYYY-Www'."""
    now = now or datetime.now(UTC)
    y, w, _ = (now - timedelta(days=7)).isocalendar()
    return f"{y}-W{w:02d}"


def fmt_rate(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage, or "—" when undefined."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * float(x):.{digits}f}%"


def _fmt_delta(now: float, before: float) -> str:
    if any(v is None or math.isnan(v) for v in (now, before)):
        return "—"
    return f"{100 * (now - before):+.1f} pp"


def _fmt_ms(x: Any) -> str:
    return fmt_duration_ms(None if x is None else float(x))


def _collect(
    client: Client, db: str, rw: ReportWindow, rules: Sequence[Rule], source: str
) -> dict[str, Any]:
    as_of = rw.as_of
    w = Window(start=rw.start, end=rw.end, as_of=as_of)
    prev = Window(start=rw.prev_start, end=rw.start, as_of=as_of)
    kw: dict[str, Any] = {"database": db}
    # one split of the week's cohort, rolled up to the total, the days, the pairs, the modes
    split = funnel(client, window=w, by=("pair", "mode"), bucket="day", **kw)
    data = {
        "rw": rw,
        "window": w,
        "now": rollup(split).iloc[0].to_dict(),
        "prev": funnel(client, window=prev, **kw).iloc[0].to_dict(),
        "daily": rollup(split, ("bucket",)),
        "pairs": rollup(split, ("pair",)),
        "modes": rollup(split, ("mode",)),
        "lat": latencies(client, window=w, **kw).iloc[0].to_dict(),
        "anom": anomalies(client, window=w, **kw),
        "keyless": keyless_writes(client, w, **kw),
        "unresolved": handoffs_behind(client, window=w, stage="unresolved", limit=50, **kw),
    }
    data["slo"] = slo_section(client, rules, week=w, database=db)
    data["slo_source"] = source
    lost = lost_by_pair(data["pairs"])
    data["worst"] = lost[lost["rankable"] & (lost["lost"] > 0)].head(WORST_PAIRS)
    data["unranked"] = int((~lost["rankable"]).sum())
    return data


def _worst_rows(d: Mapping[str, Any]) -> list[list[Any]]:
    """pair, settled, lost, lost beyond the fleet's rate, failing stage, the stage rates, P(e2e)."""
    return [
        [r.pair, r.settled, r.lost, f"{r.excess_lost:+.0f}", r.failing_stage, fmt_rate(r.p_accept), fmt_rate(r.p_execute),
         fmt_rate(r.p_evidence), fmt_rate(r.p_commit), fmt_rate(r.p_e2e)]
        for r in d["worst"].itertuples()
    ]  # fmt: skip


_WORST_HEADER: Final = ["pair", "settled", "lost", "beyond fleet", "failing stage", "P(accept)", "P(execute)",
                        "P(evidence)", "P(commit)", "P(e2e)"]  # fmt: skip


def _worst_note(d: Mapping[str, Any]) -> str:
    return (
        "Ranked by handoffs lost beyond the fleet's rate (lost: settled, not committed), with "
        "the stage losing the most; "
        "beyond fleet = lost minus what the pair would lose at the whole fleet's rate; "
        f"pairs with at least {MIN_N} settled ({d['unranked']} smaller pairs not ranked)."
    )


#: under the headline: P(evidence) is checked, the emitter's mark is shown beside it
_EVIDENCE_NOTE: Final = (
    "P(evidence) counts a result only when its emitter marked the evidence valid and the "
    "checks its envelope declares pass (evidence policy, reply contract); the line below it "
    "counts the emitter's mark alone."
)
_HEADLINE = (
    ("volume", "handoffs created"),
    ("settled", "settled"),
    ("in_flight", "in flight"),
    ("p_accept", "P(accept)"),
    ("p_execute", "P(execute | accepted)"),
    ("p_evidence", "P(evidence | executed)"),
    ("p_evidence_claimed", "P(evidence marked valid by the emitter | executed)"),
    ("p_commit", "P(commit | evidenced)"),
    ("p_e2e", "P(end to end)"),
    ("unknown_rate", "unknown rate"),
    ("escalation_rate", "escalation rate"),
    ("unresolved_now", "unknown, unresolved now"),
)


def _headline_rows(d: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """metric, this period, the period before, change."""
    rows = []
    for key, label in _HEADLINE:
        a, b = d["now"][key], d["prev"][key]
        if key in RATE_COLUMNS:
            rows.append((label, fmt_rate(a), fmt_rate(b), _fmt_delta(a, b)))
        else:
            rows.append((label, f"{int(a):,}", f"{int(b):,}", f"{int(a) - int(b):+,}"))
    return rows


def _outcome_rows(d: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """How the handoffs ended (analytics.rollup.OUTCOMES): outcome, this period, the period
    before, change (handoffs)."""
    rows = []
    for o in OUTCOMES:
        a, b = int(d["now"][f"outcome_{o}"]), int(d["prev"][f"outcome_{o}"])
        rows.append((o.replace("_", " "), f"{a:,}", f"{b:,}", f"{a - b:+,}"))
    return rows


_OUTCOME_NOTE: Final = (
    "Handoffs created in the period that entered each state; unknown open: entered unknown "
    "and not resolved at the report's clock; unknown resolved: entered unknown and left it."
)


#: Agent pairs listed under the keyless side-effecting writes (the largest share first)
KEYLESS_PAIRS: Final = 10
_KEYLESS_NOTE: Final = (
    "Side-effecting handoffs (commands, and every shared-queue handoff) sent without an "
    "idempotency key, per agent pair: no receiver can tell a resend from a new request. "
    "Duplicates: flagged keyless_duplicate_write (the same payload to the same agent within "
    "the keyless window). Pairs with a keyless one, the largest share first."
)
_KEYLESS_HEADER: Final = ["pair", "side-effecting", "keyless", "keyless share", "duplicates"]


def _keyless_rows(d: Mapping[str, Any]) -> list[list[Any]]:
    df = d["keyless"]
    return [
        [f"{r.from_agent}->{r.to_agent}", r.side_effecting, r.keyless, fmt_rate(r.keyless_share),
         r.duplicates]
        for r in df[df["keyless"] > 0].head(KEYLESS_PAIRS).itertuples()
    ]  # fmt: skip


def _md(d: Mapping[str, Any]) -> str:
    rw = d["rw"]
    lines = [
        f"# Handoff reliability, {rw.title}",
        f"{rw.describe()}. Rates over settled handoffs; — = undefined.",
        "",
        "## Headline",
        f"| metric | {' | '.join(rw.columns)} | change |",
        "|---|---|---|---|",
        *(f"| {a.replace('|', '&#124;')} | {b} | {c} | {e} |" for a, b, c, e in _headline_rows(d)),
        "",
        _EVIDENCE_NOTE,
        "",
        "## Outcomes",
        _OUTCOME_NOTE,
        "",
        f"| outcome | {' | '.join(rw.columns)} | change |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {e} |" for a, b, c, e in _outcome_rows(d)),
        "",
        *md_lines(d["slo"], d["slo_source"]),
        "",
        "## Latency",
        *(
            f"- {name}: p50 {_fmt_ms(d['lat'][f'{name}_p50_ms'])}, p95 {_fmt_ms(d['lat'][f'{name}_p95_ms'])}, "
            f"p99 {_fmt_ms(d['lat'][f'{name}_p99_ms'])} (n={int(d['lat'][f'{name}_n'])})"
            for name in ("accept", "result", "commit", "resolve")
        ),
        "",
        "## Worst agent pairs",
        _worst_note(d),
        "",
        f"| {' | '.join(_WORST_HEADER)} |",
        "|---" * len(_WORST_HEADER) + "|",
        *(f"| {' | '.join(str(c).replace('|', '&#124;') for c in r)} |" for r in _worst_rows(d)),
        "",
        "## Modes",
        "| mode | settled | P(e2e) | escalation rate |",
        "|---|---|---|---|",
        *(
            f"| {r.mode or '(none)'} | {r.settled} | {fmt_rate(r.p_e2e)} | {fmt_rate(r.escalation_rate)} |"
            for r in d["modes"].itertuples()
        ),
        "",
        "## Anomalies",
        "| kind | count | examples | meaning |",
        "|---|---|---|---|",
        *(
            f"| {r.kind} | {r.count} | {', '.join(r.examples)} | {r.description.replace('|', '&#124;')} |"
            for r in d["anom"].itertuples()
        ),
        "",
        "## Keyless side-effecting writes",
        _KEYLESS_NOTE,
        "",
        f"| {' | '.join(_KEYLESS_HEADER)} |",
        "|---" * len(_KEYLESS_HEADER) + "|",
        *(f"| {' | '.join(str(c).replace('|', '&#124;') for c in r)} |" for r in _keyless_rows(d)),
        "",
        f"## Unknowns still unresolved ({len(d['unresolved'])} shown, at most 50)",
        *(
            f"- {r.handoff_id} ({r.from_agent}->{r.to_agent}, {r.mode}, created {r.created:%Y-%m-%d %H:%M}Z)"
            for r in d["unresolved"].itertuples()
        ),
    ]
    return "\n".join(lines) + "\n"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html_safe(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _charts(d: Mapping[str, Any]) -> list[str]:
    """The funnel, the daily trend, the handoffs lost by the worst pairs (SVG)."""
    stages = (("settled", "Settled"), ("accepted", "Accepted"), ("executed", "Executed"),
              ("evidence_claimed", "Evidence claimed"), ("evidenced", "Evidenced"),
              ("committed", "Committed"))  # fmt: skip
    out = [
        charts.funnel_svg(d["now"], stages),
        charts.trend_svg(
            d["daily"], ("p_e2e", "p_accept", "unknown_rate"), "Daily rates (created day, UTC)"
        ),
    ]
    if len(d["worst"]):
        out.append(charts.lost_svg(d["worst"], tuple(LOST_STAGES)))
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.met{color:#17803d}.breached{color:#b42318;font-weight:bold}"""


def _html(d: Mapping[str, Any]) -> str:
    rw = d["rw"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Handoff reliability, {rw.title}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Handoff reliability, {rw.title}</h1>",
        f"<p>{html.escape(rw.describe())}. Rates are over settled handoffs; — means undefined.</p>",
        "<h2>Headline</h2>",
        _table(["metric", *rw.columns, "change"], [list(r) for r in _headline_rows(d)]),
        f"<p>{html.escape(_EVIDENCE_NOTE)}</p>",
        f"<h2>Outcomes</h2><p>{html.escape(_OUTCOME_NOTE)}</p>",
        _table(["outcome", *rw.columns, "change"], [list(r) for r in _outcome_rows(d)]),
        html_section(d["slo"], d["slo_source"]),
        *_charts(d),
        "<h2>Latency</h2>",
        _table(
            ["stage", "p50", "p95", "p99", "samples"],
            [
                [
                    name,
                    *(_fmt_ms(d["lat"][f"{name}_{p}_ms"]) for p in ("p50", "p95", "p99")),
                    int(d["lat"][f"{name}_n"]),
                ]
                for name in ("accept", "result", "commit", "resolve")
            ],
        ),
        f"<h2>Worst agent pairs</h2><p>{html.escape(_worst_note(d))}</p>",
        _table(_WORST_HEADER, _worst_rows(d)),
        "<h2>Modes</h2>",
        _table(
            ["mode", "settled", "P(e2e)", "escalation rate"],
            [
                [r.mode or "(none)", r.settled, fmt_rate(r.p_e2e), fmt_rate(r.escalation_rate)]
                for r in d["modes"].itertuples()
            ],
        ),
        "<h2>Anomalies</h2>",
        _table(
            ["kind", "count", "examples", "meaning"],
            [
                [r.kind, r.count, ", ".join(r.examples), r.description]
                for r in d["anom"].itertuples()
            ],
        ),
        f"<h2>Keyless side-effecting writes</h2><p>{html.escape(_KEYLESS_NOTE)}</p>",
        _table(_KEYLESS_HEADER, _keyless_rows(d)),
        f"<h2>Unknowns still unresolved</h2><p>{len(d['unresolved'])} shown (at most 50).</p>",
        _table(
            ["handoff", "task", "pair", "mode", "created (UTC)"],
            [
                [
                    r.handoff_id,
                    r.task_id,
                    f"{r.from_agent}->{r.to_agent}",
                    r.mode,
                    f"{r.created:%Y-%m-%d %H:%M:%S}",
                ]
                for r in d["unresolved"].itertuples()
            ],
        ),
        "</body></html>",
    ]
    return "\n".join(parts)


def weekly_report(
    client: Client,
    *,
    database: str | None = None,
    week: str | None = None,
    fmt: str = "html",
    rules: str | None = None,
    as_of: datetime | None = None,
) -> str:
    """The report for ISO week `week`, by default the 7 days before `as_of`, as a string
    (report_window: the cohort, printed with an inclusive end; a week in progress is
    marked incomplete).

    fmt "html": one self-contained page (SVG charts, no script: opens offline); "md": Markdown.
    rules: the SLO rules file (analytics.slo.burn.rules_file: this, else HANDOFFS_SLO_RULES, else
    deploy/slos.yaml — the file the dashboard and `handoffs alerts check` read). Both weeks
    are evaluated at `as_of` (default now), so last week is at least as settled as this one.
    ValueError for a bad week or format; analytics.slo.burn.RulesError (a ValueError) for rules
    that cannot be read or are refused.
    """
    db = check_db(database)
    if fmt not in ("html", "md"):
        raise ValueError(f"fmt must be 'html' or 'md', got {fmt!r}")
    path = str(rules_file(rules))
    rw = report_window(week=week, as_of=as_of)
    data = _collect(client, db, rw, load_rules(path), path)
    return _html(data) if fmt == "html" else _md(data)
