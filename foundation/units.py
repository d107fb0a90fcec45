"""Numbers and messages as people read them: durations in the unit that fits, a count with
its noun in the right number, a long message shortened at a word. Pure functions; every
command line and report prints through them, so one latency reads the same everywhere.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["MISSING", "fmt_duration_ms", "plural", "shorten"]

#: what a missing or undefined number prints as
MISSING: Final = "—"


def fmt_duration_ms(ms: float | None) -> str:
    """A duration given in milliseconds, in the unit that fits: "850 ms" below 1 s, "12.3 s"
    below 2 min, "7 min 58 s" below 1 h, "2 h 5 min" below 2 days, then "3 d 4 h" (each
    rounded to its smaller unit). None or NaN is "—"; a negative duration keeps its sign."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return MISSING
    ms = float(ms)
    if ms < 0:
        return "-" + fmt_duration_ms(-ms)
    if ms < 999.5:
        return f"{ms:,.0f} ms"
    s = ms / 1000
    if round(s, 1) < 120:
        return f"{s:.1f} s"
    total_s = round(s)
    if total_s < 3600:
        m, sec = divmod(total_s, 60)
        return f"{m} min {sec} s"
    total_min = round(s / 60)
    if total_min < 48 * 60:
        h, m = divmod(total_min, 60)
        return f"{h} h {m} min"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} d {h} h"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """`n` with thousands separators, then `noun`, or its plural (`many`, default noun + "s")
    unless n is 1: "1 problem", "2 problems", "1,204 handoffs"."""
    return f"{n:,} {noun if n == 1 else (many or noun + 's')}"


def shorten(text: str, limit: int = 300) -> str:
    """`text` on one line (runs of whitespace as one space), at most `limit` characters: a
    longer one is cut at the last word boundary before the limit and ends with "…"; a word
    longer than half the limit is cut inside."""
    one = " ".join(text.split())
    if len(one) <= limit:
        return one
    cut = one[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.(") + "…"
