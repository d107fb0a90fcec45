"""The weekly reliability report: one self-contained HTML file (plotly inlined) or Markdown.

Built only from the public loaders (funnel, latencies, anomalies, handoffs_behind), so the
report shows exactly the numbers the dashboard and `handoffs metrics` show.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._common import Window, check_db
from analytics.anomalies import anomalies
from analytics.display import html_safe
from analytics.metrics import RATE_COLUMNS, funnel, handoffs_behind, latencies
from analytics.rollup import rollup

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "DEFAULT_SLO",
    "SLO_MAX_METRICS",
    "default_week",
    "fmt_rate",
    "parse_slo",
    "parse_week",
    "slo_status",
    "weekly_report",
]

#: SLO targets used when none are given: fractions 0..1.
DEFAULT_SLO: Final = {"p_e2e": 0.9, "p_accept": 0.95, "unknown_rate": 0.02}
#: Metrics where lower is better (the target is a ceiling); every other rate is a floor.
SLO_MAX_METRICS: Final = frozenset({"unknown_rate", "escalation_rate"})
_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
#: Pairs / modes need this many settled handoffs to be ranked among the worst.
MIN_SETTLED_TO_RANK: Final = 5


def parse_week(week: str) -> datetime:
    """Monday 00:00 UTC of ISO week 'YYYY-Www'; ValueError naming the problem otherwise."""
    m = _WEEK.match(week or "")
    if not m:
        raise ValueError(f"week {week!r}: expected ISO week like 2026-W48")
    try:
        d = date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1)
    except ValueError as exc:
        raise ValueError(f"week {week!r}: {exc}") from None
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def default_week(now: datetime | None = None) -> str:
    """The last full ISO week before `now` (default the current time), as 'YYYY-Www'."""
    now = now or datetime.now(UTC)
    y, w, _ = (now - timedelta(days=7)).isocalendar()
    return f"{y}-W{w:02d}"


def parse_slo(spec: str | None) -> dict[str, float]:
    """'p_e2e=0.9,unknown_rate=0.02' -> {name: target}; ValueError naming the bad part."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"SLO {part!r}: expected metric=target, e.g. p_e2e=0.9")
        if name not in RATE_COLUMNS:
            raise ValueError(
                f"SLO {part!r}: unknown metric {name!r}; choose from {', '.join(RATE_COLUMNS)}"
            )
        try:
            target = float(value)
        except ValueError:
            raise ValueError(f"SLO {part!r}: target {value!r} is not a number") from None
        if not 0 <= target <= 1:
            raise ValueError(f"SLO {part!r}: target must be a fraction in [0, 1]")
        out[name] = target
    return out


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
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{float(x):,.0f} ms"


@dataclass(frozen=True, slots=True)
class SloRow:
    metric: str
    target: float
    actual: float
    status: str  # "met" | "breached" | "no data"


def slo_status(row: dict[str, Any], slo: dict[str, float]) -> list[SloRow]:
    """Each target against the funnel row: a floor for p_* rates, a ceiling for
    SLO_MAX_METRICS; "no data" when the rate is undefined."""
    out = []
    for metric, target in slo.items():
        actual = float(row.get(metric, math.nan))
        if math.isnan(actual):
            status = "no data"
        elif metric in SLO_MAX_METRICS:
            status = "met" if actual <= target else "breached"
        else:
            status = "met" if actual >= target else "breached"
        out.append(SloRow(metric, target, actual, status))
    return out


def _collect(client: Client, db: str, week: str, as_of: datetime | None, slo: dict[str, float]):
    start = parse_week(week)
    w = Window(start=start, end=start + timedelta(days=7), as_of=as_of)
    prev = Window(start=start - timedelta(days=7), end=start, as_of=as_of)
    kw: dict[str, Any] = {"database": db}
    # one split of the week's cohort, rolled up to the total, the days, the pairs, the modes
    split = funnel(client, window=w, by=("pair", "mode"), bucket="day", **kw)
    data = {
        "week": week,
        "window": w,
        "now": rollup(split).iloc[0].to_dict(),
        "prev": funnel(client, window=prev, **kw).iloc[0].to_dict(),
        "daily": rollup(split, ("bucket",)),
        "pairs": rollup(split, ("pair",)),
        "modes": rollup(split, ("mode",)),
        "lat": latencies(client, window=w, **kw).iloc[0].to_dict(),
        "anom": anomalies(client, window=w, **kw),
        "unresolved": handoffs_behind(client, window=w, stage="unresolved", limit=50, **kw),
    }
    data["slo"] = slo_status(data["now"], slo)
    return data


def _worst(df: pd.DataFrame, key: str, n: int = 10) -> pd.DataFrame:
    if df.empty:
        return df
    ranked = df[df["settled"] >= MIN_SETTLED_TO_RANK].copy()
    ranked["_r"] = ranked["p_e2e"].fillna(2.0)
    return ranked.sort_values(["_r", key]).head(n).drop(columns="_r")


_HEADLINE = (
    ("volume", "handoffs created"),
    ("settled", "settled"),
    ("in_flight", "in flight"),
    ("p_accept", "P(accept)"),
    ("p_execute", "P(execute | accepted)"),
    ("p_evidence", "P(evidence | executed)"),
    ("p_commit", "P(commit | evidenced)"),
    ("p_e2e", "P(end to end)"),
    ("unknown_rate", "unknown rate"),
    ("escalation_rate", "escalation rate"),
    ("unresolved_now", "unknown, unresolved now"),
)


def _headline_rows(d) -> list[tuple[str, str, str, str]]:
    rows = []
    for key, label in _HEADLINE:
        a, b = d["now"][key], d["prev"][key]
        if key in RATE_COLUMNS:
            rows.append((label, fmt_rate(a), fmt_rate(b), _fmt_delta(a, b)))
        else:
            rows.append((label, f"{int(a):,}", f"{int(b):,}", f"{int(a) - int(b):+,}"))
    return rows


def _md(d) -> str:
    w = d["window"]
    lines = [
        f"# Handoff reliability, week {d['week']}",
        f"Window {w.start:%Y-%m-%d} to {w.end:%Y-%m-%d} (UTC, created time); as of "
        f"{w.clock():%Y-%m-%dT%H:%M:%SZ}. Rates over settled handoffs; — = undefined.",
        "",
        "## Headline",
        "| metric | this week | last week | change |",
        "|---|---|---|---|",
        *(f"| {a.replace('|', '&#124;')} | {b} | {c} | {e} |" for a, b, c, e in _headline_rows(d)),
        "",
        "## SLO status",
        "| metric | target | actual | status |",
        "|---|---|---|---|",
        *(
            f"| {s.metric} | {'<=' if s.metric in SLO_MAX_METRICS else '>='} {fmt_rate(s.target)} "
            f"| {fmt_rate(s.actual)} | {s.status} |"
            for s in d["slo"]
        ),
        "",
        "## Latency",
        *(
            f"- {name}: p50 {_fmt_ms(d['lat'][f'{name}_p50_ms'])}, p95 {_fmt_ms(d['lat'][f'{name}_p95_ms'])}, "
            f"p99 {_fmt_ms(d['lat'][f'{name}_p99_ms'])} (n={int(d['lat'][f'{name}_n'])})"
            for name in ("accept", "result", "commit", "resolve")
        ),
        "",
        "## Worst agent pairs (by P(end to end), at least 5 settled)",
        "| pair | settled | P(e2e) | P(accept) | unknown rate |",
        "|---|---|---|---|---|",
        *(
            f"| {r.pair} | {r.settled} | {fmt_rate(r.p_e2e)} | {fmt_rate(r.p_accept)} | {fmt_rate(r.unknown_rate)} |"
            for r in _worst(d["pairs"], "pair").itertuples()
        ),
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
        "| kind | count | examples |",
        "|---|---|---|",
        *(f"| {r.kind} | {r.count} | {', '.join(r.examples)} |" for r in d["anom"].itertuples()),
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


def _charts(d) -> list[str]:
    import plotly.graph_objects as go

    daily = d["daily"]
    x = [b.strftime("%Y-%m-%d") for b in daily["bucket"]] if len(daily) else []
    trend = go.Figure()
    for col, name in (
        ("p_e2e", "P(e2e)"),
        ("p_accept", "P(accept)"),
        ("unknown_rate", "unknown rate"),
    ):
        trend.add_trace(
            go.Scatter(
                x=x, y=list(daily[col]) if len(daily) else [], mode="lines+markers", name=name
            )
        )
    trend.update_layout(
        title="Daily rates (created day, UTC)",
        yaxis={"tickformat": ".0%", "range": [0, 1]},
        height=360,
    )
    vol = go.Figure(go.Bar(x=x, y=list(daily["volume"]) if len(daily) else [], name="handoffs"))
    vol.update_layout(title="Handoffs created per day", height=300)
    stages = ["settled", "accepted", "executed", "evidenced", "committed"]
    fun = go.Figure(go.Funnel(y=stages, x=[int(d["now"][s]) for s in stages]))
    fun.update_layout(title="Funnel of settled handoffs", height=320)
    out = []
    for i, fig in enumerate((fun, trend, vol)):
        out.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_width="100%"))
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.met{color:#17803d}.breached{color:#b42318;font-weight:bold}"""


def _html(d) -> str:
    w = d["window"]
    slo_rows = "".join(
        f"<tr><td>{s.metric}</td><td>{'≤' if s.metric in SLO_MAX_METRICS else '≥'} {fmt_rate(s.target)}</td>"
        f"<td>{fmt_rate(s.actual)}</td><td class='{s.status.replace(' ', '-')}'>{s.status}</td></tr>"
        for s in d["slo"]
    )
    worst = _worst(d["pairs"], "pair")
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Handoff reliability {html.escape(d['week'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Handoff reliability, week {html.escape(d['week'])}</h1>",
        f"<p>Cohort: handoffs created {w.start:%Y-%m-%d} to {w.end:%Y-%m-%d} (UTC); as of "
        f"{w.clock():%Y-%m-%dT%H:%M:%SZ}. Rates are over settled handoffs; — means undefined.</p>",
        "<h2>Headline</h2>",
        _table(
            ["metric", "this week", "last week", "change"], [list(r) for r in _headline_rows(d)]
        ),
        "<h2>SLO status</h2><table><thead><tr><th>metric</th><th>target</th><th>actual</th>"
        f"<th>status</th></tr></thead><tbody>{slo_rows}</tbody></table>",
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
        f"<h2>Worst agent pairs</h2><p>By P(end to end), pairs with at least {MIN_SETTLED_TO_RANK} settled.</p>",
        _table(
            ["pair", "settled", "P(e2e)", "P(accept)", "P(evidence)", "unknown rate"],
            [
                [
                    r.pair,
                    r.settled,
                    fmt_rate(r.p_e2e),
                    fmt_rate(r.p_accept),
                    fmt_rate(r.p_evidence),
                    fmt_rate(r.unknown_rate),
                ]
                for r in worst.itertuples()
            ],
        ),
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
    slo: dict[str, float] | None = None,
    as_of: datetime | None = None,
) -> str:
    """The report for ISO week `week` (default: the last full week) as a string.

    fmt "html": one self-contained page (plotly.js inlined, opens offline); "md": Markdown.
    slo: {rate: target} (default DEFAULT_SLO). Both weeks are evaluated at `as_of`
    (default now), so last week is at least as settled as this one. ValueError for a bad
    week, format or SLO metric.
    """
    db = check_db(database)
    if fmt not in ("html", "md"):
        raise ValueError(f"fmt must be 'html' or 'md', got {fmt!r}")
    targets = dict(DEFAULT_SLO if slo is None else slo)
    for k in targets:
        if k not in RATE_COLUMNS:
            raise ValueError(f"unknown SLO metric {k!r}; choose from {', '.join(RATE_COLUMNS)}")
    data = _collect(client, db, week or default_week(as_of), as_of, targets)
    return _html(data) if fmt == "html" else _md(data)
