"""Alerts: the SLOs of the rules file, firing burn-rate alerts first, then each SLO's remaining
error budget and its burn rates per window pair (method and schema: docs/alerts.md).

The rules file (dashboard._slo): `--rules FILE` after `--` on a streamlit command line, else
HANDOFFS_SLO_RULES (`handoffs dashboard --rules FILE` sets it), else deploy/slos.yaml: the one
the Overview's verdict, `handoffs alerts check` and the weekly report read. The verdict on top
(healthy / ticket / paging) is analytics.slo.verdict's, as on the Overview.
`?as_of=2026-11-23T12:00:00Z` evaluates at that time instead of now (a link to what the SLOs
looked like then).
"""

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from analytics.slo import burn as slo
from analytics.slo.verdict import verdict
from dashboard import _slo, _ui


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}×"


src = _ui.start_page("Alerts")
path = _slo.rules_path()
text = _slo.read_rules(path)
if text is None:
    st.info(
        f"No SLO rules file at `{path}`. Write one (docs/alerts.md has the schema) and point "
        f"the dashboard at it with `handoffs dashboard --rules FILE` or {slo.SLO_RULES.env}=FILE.",
        icon=":material/rule:",
    )
    st.stop()
try:
    slo.parse_rules(text, path=path)
except slo.RulesError as exc:
    st.error(f"The SLO rules are refused:\n\n```\n{exc}\n```", icon=":material/rule:")
    st.stop()

with _ui.guard():
    raw = st.query_params.get("as_of")
    as_of = (
        _ui.parse_utc(raw, field="as_of")
        if raw
        else datetime.now(UTC).replace(second=0, microsecond=0)
    )
    statuses = _slo.evaluate(src.store, src.database, path, text, as_of.isoformat())

if not statuses:
    st.info(f"`{path}` defines no SLOs.", icon=":material/inbox:")
    st.stop()

v = verdict(statuses)
st.markdown(f"**Verdict: {v.level}** — {v.summary.partition(': ')[2]}")
st.caption(f"{len(statuses)} SLO(s) of `{path}` evaluated as of {as_of:%Y-%m-%d %H:%M} UTC")
firing = [(s, a) for s in statuses for a in s.alerts if a.firing]
st.subheader("Firing")
if not firing:
    st.success("No alert is firing.", icon=":material/check_circle:")
for s, a in firing:
    pairs = "; ".join(
        f"{p.window.label}: {_x(p.long_burn)} / {_x(p.short_burn)} (threshold {p.window.factor:g}×)"
        for p in a.pairs
        if p.firing
    )
    st.error(
        f"**{a.name}** ({a.severity}) — {s.rule.objective} burning: {pairs}",
        icon=":material/notifications_active:",
    )

st.subheader("Error budget remaining")
cols = st.columns(min(4, len(statuses)))
for i, s in enumerate(statuses):
    b = s.budget_remaining
    cols[i % len(cols)].metric(
        s.rule.name,
        slo.budget_text(b),
        help=f"{s.rule.objective}, target {100 * s.rule.target:g}% over "
        f"{slo.fmt_duration(s.rule.window)}: 1 - bad fraction / allowed bad fraction",
        border=True,
    )

rows = [
    {
        "SLO": s.rule.name,
        "objective": s.rule.objective,
        "scope": ", ".join(f"{k}={v}" for k, v in s.rule.where) or "all",
        "target": f"{100 * s.rule.target:g}% / {slo.fmt_duration(s.rule.window)}",
        "alert": a.severity,
        "burn rates long/short": "  ".join(
            f"{p.window.label} {_x(p.long_burn)}/{_x(p.short_burn)} (>{p.window.factor:g}×)"
            for p in a.pairs
        ),
        "state": "FIRING" if a.firing else "ok",
    }
    for s in statuses
    for a in s.alerts
]
st.dataframe(pd.DataFrame(rows), hide_index=True, key="al_table")
_ui.footer(src, "Alerts")
