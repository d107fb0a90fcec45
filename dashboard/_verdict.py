"""The Overview's verdict line: the SLOs' state, the top contributor, one link to act.

Thin: the verdict is analytics.slo.verdict.verdict over the SLO rules file's evaluations
(dashboard._slo, the file the Alerts page, `handoffs alerts check` and the weekly report
read), the contributor analytics.slo.verdict.top_contributor over analytics.pairs_lost's table
of the picked window. Evaluated at the window's end (at its `as_of` when earlier, never
after now), so a link to a past window shows the verdict of then. Kept to one bordered
block of two short lines so the KPI tiles stay above the fold at 1280×720.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import streamlit as st

from analytics.pairs_lost import lost_by_pair
from analytics.slo import burn as slo
from analytics.slo.verdict import Contributor, Verdict, top_contributor, verdict
from dashboard import _data, _slo, _ui
from dashboard._store import StoreUnavailable

if TYPE_CHECKING:
    from dashboard._ui import Picked

__all__ = ["eval_time", "show"]

_BADGE = {"healthy": "green", "ticket": "orange", "paging": "red"}
_ICON = {
    "healthy": ":material/check_circle:",
    "ticket": ":material/confirmation_number:",
    "paging": ":material/notifications_active:",
}
_ISO = "%Y-%m-%dT%H:%M:%SZ"


def eval_time(p: Picked, *, now: datetime) -> datetime:
    """When the SLOs are evaluated for window `p`: its end, its as_of when earlier, never
    after `now`; whole minutes (cache-friendly)."""
    t = min(p.end, p.as_of or p.end, now)
    return t.replace(second=0, microsecond=0)


def _statuses(src: _data.Source, at: datetime) -> tuple[str, tuple[slo.SloStatus, ...] | None]:
    """(rules path, evaluations), evaluations None with a caption shown when there are none."""
    path = _slo.rules_path()
    text = _slo.read_rules(path)
    if text is None:
        st.caption(f"No SLO verdict: no rules file at `{path}` (docs/alerts.md).")
        return path, None
    try:
        return path, _slo.evaluate(src.store, src.database, path, text, at.isoformat())
    except slo.RulesError:
        st.caption(f"No SLO verdict: the rules of `{path}` are refused (see the Alerts page).")
    except (_data.QueryFailed, StoreUnavailable, ValueError) as exc:
        st.caption(f"No SLO verdict: {_ui.user_text(exc, limit=160)}")
    return path, None


def _contributor(src: _data.Source, p: Picked) -> Contributor | None:
    try:
        df = _data.funnel(src.store, src.database, *p.args, by=("from_agent", "to_agent"),
                          tenant=p.tenant)  # fmt: skip
    except (_data.QueryFailed, StoreUnavailable):
        return None
    return top_contributor(lost_by_pair(df)) if len(df) else None


def _link(v: Verdict, c: Contributor | None, p: Picked, at: datetime) -> str:
    if v.level != "healthy":
        return f"[Open Alerts →](alerts?{urlencode({'as_of': at.strftime(_ISO)})})"
    if c is None:
        return ""
    q = {"from": p.start.strftime(_ISO), "to": p.end.strftime(_ISO)}
    if p.as_of:
        q["as_of"] = p.as_of.strftime(_ISO)
    if p.tenant:
        q["tenant"] = p.tenant
    return f"[Open in Slices →](slices?{urlencode(q)})"


def show(src: _data.Source, p: Picked) -> None:
    """The verdict block; a caption instead when no verdict can be given."""
    at = eval_time(p, now=datetime.now(UTC))
    path, statuses = _statuses(src, at)
    if statuses is None:
        return
    v = verdict(statuses)
    c = _contributor(src, p)
    head = (
        f"{v.slos} SLO{'s' if v.slos != 1 else ''}, none firing"
        if v.level == "healthy"
        else f"{', '.join(f'`{a}`' for a in v.firing)} firing"
    )
    line1 = (
        f"**Verdict** :{_BADGE[v.level]}-badge[{_ICON[v.level]} {v.level}] {head} "
        f"· as of {at:%Y-%m-%d %H:%M} UTC · `{path}`"
    )
    lost = (
        f"Top contributor: {_ui.user_text(c.evidence, limit=120)}"
        if c
        else "No pair with enough settled handoffs lost any in this window."
    )
    with st.container(border=True, key="ov_verdict"):
        st.markdown(f"{line1}  \n{lost} · {_link(v, c, p, at)}".rstrip(" ·"))
