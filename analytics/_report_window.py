"""The report's cohort window: the last 7 days by default, or one ISO week; printed with an
inclusive end (pure).

Why the last 7 days: a report read on a Wednesday about the last full ISO week misses the
days since Monday, and a store younger than that week shows nothing. The window ends at the
report's clock (`as_of`, rounded up to the minute) so everything stored so far is in it; an
ISO week still in progress at `as_of` is marked incomplete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Final

__all__ = ["ReportWindow", "parse_week", "report_window"]

_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
_DAYS: Final = 7


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


def _fmt(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M}"


@dataclass(frozen=True, slots=True)
class ReportWindow:
    """A report's cohort `[start, end)` (created time, UTC, minute-aligned), its clock, the
    period before it of the same length, and how to name it."""

    start: datetime
    end: datetime
    as_of: datetime
    week: str | None  # the ISO week, or None for the last 7 days

    @property
    def prev_start(self) -> datetime:
        return self.start - (self.end - self.start)

    @property
    def incomplete(self) -> bool:
        """True when the period ends after the clock: its last days are still to come."""
        return self.end > self.as_of + timedelta(minutes=1)

    @property
    def title(self) -> str:
        """'week 2026-W48' or 'last 7 days'."""
        return f"week {self.week}" if self.week else f"last {_DAYS} days"

    @property
    def columns(self) -> tuple[str, str]:
        """Headers of this period and the one before it."""
        return ("this week", "last week") if self.week else ("last 7 days", "the 7 days before")

    def inclusive(self) -> str:
        """'2026-11-23 00:00 – 2026-11-29 23:59 UTC': first and last minute in the cohort."""
        return f"{_fmt(self.start)} – {_fmt(self.end - timedelta(minutes=1))} UTC"

    def describe(self) -> str:
        """One line: the cohort, inclusive, and the clock; 'incomplete' when it applies."""
        text = f"Handoffs created {self.inclusive()}, as of {self.as_of:%Y-%m-%d %H:%M} UTC"
        if self.incomplete:
            text += " (incomplete: the week is still in progress)"
        return text


def report_window(*, week: str | None = None, as_of: datetime | None = None) -> ReportWindow:
    """The ISO week `week` ('2026-W48'), or by default the 7 days before `as_of` (default
    now), its end rounded up to the minute. ValueError for a malformed week."""
    clock = (as_of or datetime.now(UTC)).astimezone(UTC)
    if week:
        start = parse_week(week)
        return ReportWindow(start, start + timedelta(days=_DAYS), clock, week)
    end = clock.replace(second=0, microsecond=0)
    if end < clock:
        end += timedelta(minutes=1)
    return ReportWindow(end - timedelta(days=_DAYS), end, clock, None)
