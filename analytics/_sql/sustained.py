"""SQL of sustained_rejections: runs of hours whose rejection rate stays high (an outage).

A group is a (to_agent, capability) pair, as for rejection_spike (analytics/_sql/spikes.py):
a handoff counts once under each capability of its envelope, '' when it has none; groups
span tenants unless the query names one. Time is cut into UTC hours of `created`. An hour of
a group **holds** when it has at least `min_settled` settled handoffs created in it and
rejected / settled >= `rate` (compared exactly: integers, no float rounding). A **run** is a
maximal sequence of consecutive hours that hold (an hour that does not hold, or has no
settled handoff, ends it); a run of at least `hours` hours is a sustained rejection.

rejection_spike compares an hour with the 24 before it, so an outage longer than a few
hours becomes its own baseline and stops showing; a run has no baseline. An hour's verdict
depends on the whole hour and on its neighbours, never on where the window starts or ends.

The anomaly pass flags the rejected settled handoffs of the window's cohort (created in
[start, end)) created in an hour of such a run: to tell whether an hour of the window
belongs to a run of `hours` hours it reads `hours` - 1 hours on each side of the window
(one scan of the cohort over them; the per-hour rows, groups x hours, are small). The
report (analytics.sustained_rejections) reads further back and on, until each run it shows
is whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Final

from analytics._sql import contract as cs
from analytics._sql.cohort import Window, cohort_sql, ns
from foundation import settings

__all__ = [
    "HOUR_S",
    "PASSES",
    "SustainedThresholds",
    "hour_range",
    "runs_sql",
    "sustained_pass",
    "sustained_thresholds",
]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {"sustained": ("sustained_rejections",)}
#: the length of a judged bucket, seconds
HOUR_S: Final = 3600
_NS: Final = 1_000_000_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_CAP: Final = "arrayJoin(if(empty(capabilities), [''], capabilities))"


@dataclass(frozen=True, slots=True)
class SustainedThresholds:
    """When an hour holds and how long a run must last: `rate` (0 < rate <= 1, kept as an
    exact fraction), `min_settled` settled handoffs in the hour (>= 1) and `hours`
    consecutive hours (>= 1)."""

    rate: Fraction
    min_settled: int
    hours: int

    def __post_init__(self) -> None:
        if not isinstance(self.rate, Fraction) or not 0 < self.rate <= 1:
            raise ValueError(f"rate must be a fraction in (0, 1], got {self.rate!r}")
        for name in ("min_settled", "hours"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")

    def holds(self, settled: int, rejected: int) -> bool:
        """The hour rule over one hour's counts (exact)."""
        return settled >= self.min_settled and Fraction(rejected, settled) >= self.rate

    def condition(self, n: str, r: str) -> str:
        """SQL of the hour rule over settled / rejected count columns (integers only)."""
        p, q = self.rate.numerator, self.rate.denominator
        return f"({n} >= {self.min_settled} AND {r} * {q} >= {p} * {n})"


def _rate(raw: str | float | None) -> Fraction:
    text = settings.resolve(settings.SUSTAINED_REJECTION_RATE, None if raw is None else str(raw))
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{settings.SUSTAINED_REJECTION_RATE.env} must be a number in (0, 1], got {text!r}"
        ) from None
    if not 0 < value <= 1:
        raise ValueError(
            f"{settings.SUSTAINED_REJECTION_RATE.env} must be a number in (0, 1], got {text!r}"
        )
    return Fraction(value).limit_denominator(10_000)


def sustained_thresholds(
    *, rate: float | str | None = None, min_settled: int | None = None, hours: int | None = None
) -> SustainedThresholds:
    """Thresholds from the arguments, then HANDOFFS_SUSTAINED_REJECTION_RATE / _MIN_SETTLED /
    _HOURS, then the defaults (0.5, 5, 2). ValueError naming the variable on a bad value."""
    r = _rate(rate)
    n = settings.resolve_int(settings.SUSTAINED_MIN_SETTLED, min_settled)
    h = settings.resolve_int(settings.SUSTAINED_HOURS, hours)
    for setting, v in ((settings.SUSTAINED_MIN_SETTLED, n), (settings.SUSTAINED_HOURS, h)):
        if v < 1:
            raise ValueError(f"{setting.env} must be an integer >= 1, got {v}")
    return SustainedThresholds(r, n, h)


def hour_range(window: Window) -> tuple[int, int]:
    """Indexes [first, last] of the hours (created ns // hour ns) the window touches."""
    b = HOUR_S * _NS
    return ns(window.start) // b, -(-ns(window.end) // b) - 1


def _hours_sql(db: str, window: Window, tenant: bool, first: int, last: int) -> str:
    """Per (to_agent, capability, hour b) of the hours [first, last]: n settled, r rejected
    (settled) handoffs created in it, w the rejected settled ones of the window's cohort."""
    read = Window(
        start=_EPOCH + timedelta(seconds=first * HOUR_S),
        end=_EPOCH + timedelta(seconds=(last + 1) * HOUR_S),
        as_of=window.clock(),
        settled=window.settled,  # the store's state, whatever the range read
    )
    cohort = cohort_sql(db, read, tenant_param=tenant, extra=("to_agent", "capabilities"))
    rej = cs.has("tmask", cs.REJECTED_MASK)
    lo, hi = ns(window.start), ns(window.end)
    return f"""SELECT to_agent, {_CAP} AS capability, b, sum(n0) AS n, sum(r0) AS r,
    groupArrayArray(w0) AS w
FROM (
    SELECT to_agent, capabilities, b, countIf(is_settled) AS n0,
        countIf(is_settled AND is_rej) AS r0,
        groupArrayIf((tenant, handoff_id), is_settled AND is_rej
                     AND created_ns >= {lo} AND created_ns < {hi}) AS w0
    FROM (
        SELECT tenant, handoff_id, to_agent, capabilities, is_settled, {rej} AS is_rej,
            toUnixTimestamp64Nano(created) AS created_ns,
            intDiv(created_ns, {HOUR_S * _NS}) AS b
        FROM ({cohort})
    )
    GROUP BY to_agent, capabilities, b
)
GROUP BY to_agent, capability, b"""


def runs_sql(
    db: str, window: Window, *, tenant: bool, th: SustainedThresholds, first: int, last: int
) -> str:
    """One row per run of at least th.hours hours found among the hours [first, last]:
    to_agent, capability, first_b, last_b (hour indexes: an hour's start is b x 3600 s after
    the epoch), hours, settled, rejected (over the run's hours) and ids, the rejected
    settled (tenant, handoff_id) of the window's cohort in them (a handoff once). A run that
    reaches `first` or `last` may go on beyond what was read."""
    hours = _hours_sql(db, window, tenant, first, last)
    return f"""SELECT to_agent, capability, min(b) AS first_b, max(b) AS last_b, count() AS hours,
    sum(n) AS settled, sum(r) AS rejected, arrayDistinct(groupArrayArray(w)) AS ids
FROM (
    SELECT to_agent, capability, b, n, r, w,
        b - toInt64(row_number() OVER (PARTITION BY to_agent, capability ORDER BY b)) AS run
    FROM ({hours})
    WHERE {th.condition("n", "r")}
)
GROUP BY to_agent, capability, run
HAVING hours >= {th.hours}
ORDER BY first_b, to_agent, capability"""


def sustained_pass(
    db: str, window: Window, tenant: bool, th: SustainedThresholds | None = None
) -> str:
    """The anomaly pass: tenant, handoff_id, sustained_rejections (true) per flagged handoff
    (the runs over the window's hours and th.hours - 1 on each side; their window ids)."""
    th = th or sustained_thresholds()
    first, last = hour_range(window)
    pad = th.hours - 1
    runs = runs_sql(db, window, tenant=tenant, th=th, first=first - pad, last=last + pad)
    return f"""SELECT DISTINCT id.1 AS tenant, id.2 AS handoff_id, true AS sustained_rejections
FROM ({runs})
ARRAY JOIN ids AS id"""
