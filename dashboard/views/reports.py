"""Reports: the weekly reliability report for a chosen ISO week, previewed and downloadable
as HTML or Markdown; the week's daily trend above it. `?week=2026-W48` preselects a week."""

from datetime import UTC, date, datetime, timedelta

import streamlit as st

from analytics.rollup import rollup
from dashboard import _charts, _data, _ui

WEEKS_BACK = 12

src = _ui.start_page("Reports")


def _week_label(d: date) -> str:
    y, w, _ = d.isocalendar()
    return f"{y}-W{w:02d}"


today = datetime.now(UTC).date()
weeks = [_week_label(today - timedelta(weeks=i)) for i in range(WEEKS_BACK + 1)]
got = _ui.arrived_params("reports", ("week",))
if got:
    if got["week"] not in weeks:
        weeks.append(got["week"])
    st.session_state["rp_week"] = got["week"]
st.session_state.setdefault("rp_week", weeks[1])  # the last complete week
week = st.selectbox(
    "ISO week",
    weeks,
    key="rp_week",
    persist_state="session",
    help="Monday 00:00 to Monday 00:00 UTC",
)
try:
    year, num = week.split("-W")
    monday = date.fromisocalendar(int(year), int(num), 1)
    start = datetime(monday.year, monday.month, monday.day, tzinfo=UTC)
    end = start + timedelta(days=7)
    if not _ui.EARLIEST <= start < end <= _ui.LATEST:
        raise ValueError(week)
except (ValueError, OverflowError):
    st.warning(
        f"Invalid input: week “{_ui.user_text(week)}” is not an ISO week such as 2026-W48 "
        f"between {_ui.EARLIEST:%Y} and {_ui.LATEST:%Y}.",
        icon=":material/warning:",
    )
    st.stop()
if week == weeks[0]:
    st.caption("This week is not over yet: its numbers are partial.")

with _ui.guard():
    daily = _data.funnel(
        src.store, src.database, start.isoformat(), end.isoformat(), None, bucket="day"
    )
if not len(daily) or not rollup(daily)["volume"].sum():
    st.info(f"No handoffs were created in {week}. Pick another week.", icon=":material/inbox:")
    st.stop()
st.plotly_chart(_charts.trend_figure(daily, bucket="day", x_range=(start, end)), key="rp_trend")

with _ui.guard():
    md = _data.weekly_report(src.store, src.database, week, "md")
c1, c2 = st.columns(2)
c1.download_button(
    "Download report (HTML)",
    # built when clicked (a second full report: minutes on a large store), then cached
    lambda: _data.weekly_report(src.store, src.database, week, "html"),
    file_name=f"handoffs-report-{week}.html",
    mime="text/html",
    on_click="ignore",
    icon=":material/download:",
    key="rp_dl_html",
)
c2.download_button(
    "Download report (Markdown)",
    md,
    file_name=f"handoffs-report-{week}.md",
    mime="text/markdown",
    on_click="ignore",
    icon=":material/download:",
    key="rp_dl_md",
)
with st.container(border=True):
    st.markdown(md)
st.caption(f"Report for {week}; a generated report is reused for {_data.REPORT_TTL_S} s.")
_ui.footer(src, "Reports")
