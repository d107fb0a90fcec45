"""When tasks start: a diurnal/weekly profile for backfills, Poisson arrivals for live traffic.

Times are int nanoseconds since the Unix epoch; each generator has its own seeded Random.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Final

from handoffs.simulator._catalog import MEAN_INTENTS
from handoffs.simulator._model import SimulatorConfigError

__all__ = ["backfill_starts", "live_starts"]

_S: Final = 1_000_000_000


def _diurnal(t_s: float) -> float:
    """Relative traffic at Unix time t_s: office-hours peak near 14:00 UTC, quieter weekends."""
    hour = (t_s % 86400) / 3600
    weekday = (int(t_s // 86400) + 3) % 7  # 0 = Monday (1970-01-01 was a Thursday)
    level = 0.15 + math.exp(-(((hour - 14) / 4.5) ** 2))
    return level * (0.45 if weekday >= 5 else 1.0)


def backfill_starts(seed: int, start_ns: int, end_ns: int, n_tasks: int) -> list[int]:
    """n_tasks sorted start times in [start_ns, end_ns) following a diurnal/weekly profile."""
    if end_ns <= start_ns:
        raise SimulatorConfigError("window", "end must be after start")
    if n_tasks < 0:
        raise SimulatorConfigError("n_tasks", "must be >= 0")
    rng = random.Random(f"{seed}:starts")
    peak = 1.15
    out: list[int] = []
    span = end_ns - start_ns
    while len(out) < n_tasks:
        t = start_ns + int(rng.random() * span)
        if rng.random() * peak < _diurnal(t / _S):
            out.append(t)
    out.sort()
    return out


def live_starts(seed: int, start_ns: int, handoffs_per_s: float) -> Iterator[int]:
    """Endless Poisson task arrivals from start_ns, sized so handoff intents average the rate."""
    if handoffs_per_s <= 0:
        raise SimulatorConfigError("rate", f"handoffs per second must be > 0, got {handoffs_per_s}")
    rng = random.Random(f"{seed}:live")
    lam = handoffs_per_s / MEAN_INTENTS
    t = float(start_ns)
    while True:
        t += rng.expovariate(lam) * _S
        yield int(t)
