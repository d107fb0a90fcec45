"""Shared page pieces: the store guard, window and tenant pickers, number formats, links.

Formats: rates are fractions shown as percent with one decimal ("93.1%"); an undefined rate
(None or NaN, an empty denominator) is "—", never 0 or 1. Counts use thousands separators.
Times are UTC. Query parameters (`from`, `to`, `as_of`, `tenant`, `handoff_id`) are read
once when they arrive, then the widgets own the values; a link naming only `from` ends now,
one naming only `to` starts DEFAULT_LENGTH (24 h) before it. A time outside what the store
can hold (EARLIEST..LATEST) is refused with the field named. Whatever a user or a link typed
reaches a message (rendered as Markdown) only through `user_text`: shortened, escaped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import streamlit as st

from analytics.display import terminal_safe
from dashboard import _data
from dashboard._store import StoreUnavailable

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALL_TENANTS",
    "DASH",
    "RANGES",
    "Picked",
    "arrived_params",
    "delta_color",
    "delta_count",
    "delta_rate",
    "explorer_link",
    "fmt_count",
    "fmt_rate",
    "footer",
    "guard",
    "handoffs_table",
    "is_undefined",
    "link_window",
    "parse_utc",
    "pickers",
    "set_params",
    "start_page",
    "user_text",
]

DASH = "—"
ALL_TENANTS = "All tenants"
#: Preset ranges (label -> length); "Custom" reads the from/to inputs. Presets end at the next
#: full hour (UTC): hour-aligned windows let one query serve a window and its previous period.
RANGES: dict[str, timedelta | None] = {
    "Last 3 hours": timedelta(hours=3),
    "Last 6 hours": timedelta(hours=6),
    "Last 24 hours": timedelta(hours=24),
    "Last 7 days": timedelta(days=7),
    "Last 30 days": timedelta(days=30),
    "Custom": None,
}
#: Pixel widths of handoffs_table's columns (together 890 px).
TABLE_WIDTHS: dict[str, int] = {
    "open": 180,
    "task_id": 130,
    "tenant": 80,
    "from_agent": 100,
    "to_agent": 100,
    "mode": 70,
    "created": 140,
    "last_state": 90,
}
#: The window a page opens on, and the length a link naming only one end gets.
DEFAULT_LENGTH = timedelta(hours=24)
_ISO = "%Y-%m-%dT%H:%M:%SZ"
#: The times a window may name: the range of the store's DateTime64(9) columns. Beyond it a
#: window's previous period or a report's week end cannot be computed.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(2262, 4, 11, tzinfo=UTC)
#: Markdown's syntax (links, images, HTML, emphasis, code, math, Streamlit's `:color[...]`
#: and `:icon:` directives, entities): backslash-escaped in user_text
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!|<>~$:&])")


# ---------------------------------------------------------------- formats (pure)


def is_undefined(v: Any) -> bool:
    """True for None, NaN and pandas NA: a rate whose denominator is empty."""
    if v is None:
        return True
    try:
        return bool(math.isnan(float(v)))
    except (TypeError, ValueError):
        return True


def fmt_rate(v: Any) -> str:
    """A fraction as "12.3%", or "—" when undefined."""
    return DASH if is_undefined(v) else f"{float(v):.1%}"


def fmt_count(v: Any) -> str:
    """An integer count as "12,345", or "—" when missing."""
    return DASH if is_undefined(v) else f"{int(v):,}"


def delta_rate(cur: Any, prev: Any) -> str | None:
    """Change in percentage points ("+1.2 pp"), None when either side is undefined."""
    if is_undefined(cur) or is_undefined(prev):
        return None
    pp = round((float(cur) - float(prev)) * 100, 1) + 0.0  # + 0.0: no "-0.0"
    return f"{pp:+.1f} pp"


def delta_count(cur: Any, prev: Any) -> str | None:
    """Change of a count ("+12"), None when either side is missing."""
    if is_undefined(cur) or is_undefined(prev):
        return None
    return f"{int(cur) - int(prev):+,}"


def delta_color(delta: str | None, *, inverse: bool = False) -> Literal["normal", "inverse", "off"]:
    """st.metric delta_color: grey for no change, else red-for-worse ("inverse" when up is bad)."""
    if delta is not None:
        try:
            if float(delta.replace("pp", "").replace(",", "").strip()) == 0:
                return "off"
        except ValueError:
            pass
    return "inverse" if inverse else "normal"


def user_text(value: object, limit: int = 80) -> str:
    """`value` as text safe inside a Markdown message: at most `limit` characters (then
    "…"), on one line, control and bidi characters as visible escapes, Markdown's syntax
    backslash-escaped, so what a link carries cannot open a link, load an image, add HTML
    or style the message."""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    return _MARKDOWN.sub(r"\\\1", terminal_safe(text, one_line=True))


def parse_utc(text: str, *, field: str) -> datetime:
    """ISO-8601 text (a trailing Z allowed; naive means UTC) as an aware UTC datetime.

    Raises ValueError naming `field` when the text is not a date/time or lies outside
    EARLIEST..LATEST (the message quotes at most 60 characters of the text).
    """
    raw = text.strip()
    shown = repr(text if len(text) <= 60 else text[:60] + "…")
    try:
        dt = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        raise ValueError(
            f"{field}: {shown} is not an ISO-8601 time such as 2026-11-23T00:00:00Z"
        ) from None
    try:
        dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    except OverflowError:  # an offset that moves it past year 1 or 9999
        dt = EARLIEST - timedelta(days=1)
    if not EARLIEST <= dt <= LATEST:
        raise ValueError(
            f"{field}: {shown} is outside the times the store holds "
            f"({EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d})"
        )
    return dt


def link_window(frm: str | None, to: str | None, *, now: datetime) -> tuple[str, str]:
    """The (from, to) texts of a deep link naming one or both ends of a custom window.

    A missing `to` is `now`; a missing `from` is DEFAULT_LENGTH before `to` (before now
    when `to` is not a time). Given texts are returned as they came, so a bad one is shown
    in its input and named by the page's warning.
    """
    now = now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)
    end_text = to if to is not None else now.strftime(_ISO)
    if frm is not None:
        return frm, end_text
    try:
        end = parse_utc(end_text, field="To")
    except ValueError:
        end = now
    return (end - DEFAULT_LENGTH).strftime(_ISO), end_text


def explorer_link(handoff_id: str) -> str:
    """Relative URL of the explorer page opened on one handoff (a deep link)."""
    from urllib.parse import quote

    return f"explorer?handoff_id={quote(str(handoff_id), safe='')}"


# ---------------------------------------------------------------- page plumbing


@contextmanager
def guard() -> Iterator[None]:
    """Show store and query failures as a message and stop the page (never a traceback)."""
    try:
        yield
    except StoreUnavailable as exc:
        st.error(str(exc), icon=":material/cloud_off:")
        st.stop()
    except _data.QueryFailed as exc:
        st.error(
            f"{exc}. The numbers cannot be shown right now; retry in a moment.",
            icon=":material/error:",
        )
        st.stop()
    except ValueError as exc:  # its text may carry what a link typed: shown as text only
        st.warning(f"Invalid input: {user_text(exc, limit=500)}", icon=":material/warning:")
        st.stop()


def start_page(title: str) -> _data.Source:
    """Title, store caption in the sidebar, and the connected source (or a message and stop)."""
    st.title(title)
    with guard():
        src = _data.source()
        st.sidebar.caption(f"Store: {src.target.spec.describe()} · database `{src.database}`")
        _data.client(src)
    return src


def footer(src: _data.Source, page: str) -> None:
    """The page's last element: where its numbers came from (also tells tests the page finished)."""
    st.caption(
        f"{page} · read from {src.target.spec.describe()}, database {src.database}, at "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC"
    )


def arrived_params(page: str, keys: tuple[str, ...]) -> dict[str, str]:
    """Query parameters among `keys` that arrived since this page last read them (else {}).

    Deep links are read once on arrival: after that the page's widgets own the values, and
    reruns do not reset what the user changed.
    """
    now = {k: st.query_params[k] for k in keys if k in st.query_params}
    if not now or st.session_state.get(_seen_key(page)) == now:
        return {}
    st.session_state[_seen_key(page)] = now
    return now


def set_params(page: str, params: dict[str, str]) -> None:
    """Write query parameters that describe what the page shows (a shareable URL) without
    them counting as a new arrival on the next rerun."""
    for k, v in params.items():
        st.query_params[k] = v
    st.session_state[_seen_key(page)] = dict(params)


def _seen_key(page: str) -> str:
    return f"_qp_seen_{page}"


@dataclass(frozen=True, slots=True)
class Picked:
    """The user's window and tenant as loader arguments (ISO UTC strings)."""

    start: datetime
    end: datetime
    as_of: datetime | None
    tenant: str | None
    preset: timedelta | None = None  # a "Last ..." range: it moves with the clock

    def refreshed(self) -> Picked:
        """For a preset range, the same length ending now (auto-refresh); custom stays put."""
        if self.preset is None:
            return self
        end = _next_hour()
        return Picked(
            start=end - self.preset,
            end=end,
            as_of=self.as_of,
            tenant=self.tenant,
            preset=self.preset,
        )

    @property
    def args(self) -> tuple[str, str, str | None]:
        return (
            self.start.isoformat(),
            self.end.isoformat(),
            self.as_of.isoformat() if self.as_of else None,
        )

    def previous(self) -> Picked:
        """The period of equal length just before this one (for deltas)."""
        span = self.end - self.start
        return Picked(start=self.start - span, end=self.start, as_of=self.as_of, tenant=self.tenant)

    @property
    def aligned(self) -> bool:
        """Both ends on a full UTC hour: hourly buckets split the window from the previous one."""
        return all(t.minute == t.second == t.microsecond == 0 for t in (self.start, self.end))

    def split_args(self) -> tuple[str, str, str | None, str]:
        """(start, end, as_of, bucket) of the one tenant-split funnel a page rolls up.

        Hour-aligned: hourly buckets over the previous period AND this one (one query gives
        tiles, deltas, trend and the tenant list); otherwise this window in self.bucket.
        """
        if self.aligned:
            return self.previous().start.isoformat(), self.end.isoformat(), self.args[2], "hour"
        return (*self.args, self.bucket)

    @property
    def bucket(self) -> str:
        """Trend granularity: hourly up to three days, daily beyond."""
        return "hour" if self.end - self.start <= timedelta(days=3) else "day"

    def describe(self) -> str:
        fmt = "%Y-%m-%d %H:%M"
        tail = f", as of {self.as_of.strftime(fmt)}" if self.as_of else ""
        return f"{self.start.strftime(fmt)} → {self.end.strftime(fmt)} UTC{tail}"


def _next_hour() -> datetime:
    # Presets end at the next full hour: hour-aligned (see Picked.split_args), and reruns
    # within the hour share cache entries.
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return now + timedelta(hours=1)


def pickers(src: _data.Source, page: str, *, tenant_picker: bool = True) -> Picked:
    """Sidebar time-range and tenant pickers; query params from/to/as_of/tenant seed them.

    Shows a warning and stops the page on a bad custom time (naming the field) or an empty
    range. The tenant list: the tenants with a handoff created in the window.
    """
    ss = st.session_state
    got = arrived_params(page, ("from", "to", "as_of", "tenant"))
    if "from" in got or "to" in got:
        ss["w_range"] = "Custom"
        ss["w_from"], ss["w_to"] = link_window(
            got.get("from"), got.get("to"), now=datetime.now(UTC)
        )
    if "as_of" in got:
        ss["w_as_of"] = got["as_of"]
    if "tenant" in got:
        ss["w_tenant"] = got["tenant"]
    ss.setdefault("w_range", "Last 24 hours")
    end_default = _next_hour()
    ss.setdefault("w_from", (end_default - DEFAULT_LENGTH).strftime(_ISO))
    ss.setdefault("w_to", end_default.strftime(_ISO))

    sb = st.sidebar
    sb.selectbox("Time range", list(RANGES), key="w_range", persist_state="session")
    preset: timedelta | None = None
    with guard():
        if ss["w_range"] == "Custom":
            sb.text_input("From (UTC, ISO-8601)", key="w_from", persist_state="session")
            sb.text_input("To (UTC, ISO-8601)", key="w_to", persist_state="session")
            start = parse_utc(ss["w_from"], field="From")
            end = parse_utc(ss["w_to"], field="To")
            if end <= start:
                raise ValueError(f"To ({end.isoformat()}) must be after From ({start.isoformat()})")
        else:
            end = end_default
            preset = RANGES[ss["w_range"]] or timedelta(days=1)
            start = end - preset
        as_of = parse_utc(ss["w_as_of"], field="as_of") if ss.get("w_as_of") else None

    tenant: str | None = None
    if tenant_picker:
        tenants: list[str] = []
        try:
            tenants = _data.tenants(src.store, src.database, start.isoformat(), end.isoformat())
        except (_data.QueryFailed, ValueError, StoreUnavailable):
            # the list is a convenience: without it the page still works for all tenants
            sb.caption("(tenant list unavailable)")
        options = [ALL_TENANTS, *tenants]
        if ss.get("w_tenant") and ss["w_tenant"] not in options:
            options.append(ss["w_tenant"])  # a tenant from a link with no handoffs in this window
        ss.setdefault("w_tenant", ALL_TENANTS)
        sb.selectbox("Tenant", options, key="w_tenant", persist_state="session")
        tenant = None if ss["w_tenant"] == ALL_TENANTS else ss["w_tenant"]
    picked = Picked(start=start, end=end, as_of=as_of, tenant=tenant, preset=preset)
    sb.caption(picked.describe())
    return picked


def handoffs_table(
    df: pd.DataFrame,
    *,
    key: str | None = None,
    height: int | Literal["auto", "stretch", "content"] = "auto",
) -> None:
    """A table of handoffs whose ids link into the explorer (opens in a new tab).

    Column widths (px, TABLE_WIDTHS) add up to less than the main column of the wide layout
    on a 1280 px screen, so the last column is never cut off; a longer id is shortened
    with "…" in its cell (the link and the explorer show it whole)."""
    if df is None or len(df) == 0:
        st.info("No handoffs match.", icon=":material/info:")
        return
    view = df.copy()
    view.insert(0, "open", [explorer_link(h) for h in view["handoff_id"]])
    config: dict[str, Any] = {
        c: st.column_config.Column(c, width=w) for c, w in TABLE_WIDTHS.items() if c in view
    }
    config["open"] = st.column_config.LinkColumn(
        "handoff", display_text=r"explorer\?handoff_id=(.*)", width=TABLE_WIDTHS["open"]
    )
    config["handoff_id"] = None
    if "created" in view:
        config["created"] = st.column_config.DatetimeColumn(
            "created (UTC)", format="YYYY-MM-DD HH:mm:ss", width=TABLE_WIDTHS["created"]
        )
    st.dataframe(
        view, hide_index=True, key=key, height=height, width="stretch", column_config=config
    )
