"""The sustained rate of a serve: the highest steady load at which every table's active parts
stay bounded and flat (merges keep up) and the store keeps up with what is acknowledged.
Pure: samples in, verdicts, the next rate to try and printable tables out (bench/soak.py
measures; tests/unit/test_bench_sustained.py checks these with plain values).

A hold at one rate is judged on its samples after the first third (the parts climb from
wherever the previous hold left them to the level this rate keeps): it holds when
- nothing was refused for too many parts (serve's own limit, ingest._parts) and no table's
  fullest partition went over `limit`;
- for every table, the median of the last third is at most the median of the middle third
  plus max(`tol_parts`, `tol_frac` x that median): flat, not climbing;
- the spans acknowledged but not yet stored (the spool's backlog) are flat the same way,
  with a tolerance of two seconds of the load: the store keeps up;
- the acknowledged rate over the last two thirds is at least `keep_up` x the rate asked
  (the clients were not held back: serve answered fast enough to take it).

The search starts at `start` x the burst capacity and goes down by `factor` until a rate
holds, then bisects between the highest rate that held and the lowest above it that did not,
`refine` times (or until they are within 10 %).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "PARTS_SQL",
    "WRITE_TABLES",
    "Hold",
    "Sample",
    "Verdict",
    "early_stop",
    "judge",
    "next_rate",
    "parts_by_table",
    "parts_table",
    "sustained",
]

#: the tables every write makes a part in, in the order of the write
WRITE_TABLES: Final = (
    "otel_traces",
    "handoff_transitions",
    "handoff_summary",
    "handoff_tasks",
    "handoff_anomaly_state",
    "transition_ledger",
    "ingest_batches",
)


#: the rows parts_by_table takes: active parts per table and partition of one database
PARTS_SQL: Final = (
    "SELECT table, partition_id, count() FROM system.parts "
    "WHERE database = {db:String} AND active GROUP BY table, partition_id"
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a hold: seconds since it began, active parts per table (in its fullest
    partition), spans acknowledged and stored since it began, requests serve refused for
    too many parts since it began."""

    t_s: float
    parts: Mapping[str, int]
    acked: int
    stored: int
    parts_refusals: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    holds: bool
    why: str


@dataclass(frozen=True, slots=True)
class Hold:
    """A rate tried (spans/s) and how it went."""

    rate: float
    verdict: Verdict
    samples: tuple[Sample, ...] = field(default=(), repr=False)


def parts_by_table(rows: Iterable[tuple[str, str, int]]) -> dict[str, int]:
    """(table, partition id, active parts) rows -> active parts of each table's fullest
    partition (the engine's too-many-parts limits count per partition)."""
    out: dict[str, int] = {}
    for table, _partition, n in rows:
        out[table] = max(out.get(table, 0), int(n))
    return out


def early_stop(samples: Sequence[Sample], *, limit: int) -> str | None:
    """Why a hold cannot be steady already (None: not yet known): serve refused requests for
    too many parts, or a table's fullest partition is over `limit` (0: none)."""
    if not samples:
        return None
    if samples[-1].parts_refusals > 0:
        return f"serve refused {samples[-1].parts_refusals} request(s) for too many parts"
    over = {t: n for t, n in samples[-1].parts.items() if limit and n > limit}
    if over:
        table, n = max(over.items(), key=lambda kv: kv[1])
        return f"{table} at {n} active parts (limit {limit})"
    return None


def judge(
    samples: Sequence[Sample],
    *,
    rate: float,
    limit: int,
    tol_parts: int = 10,
    tol_frac: float = 0.25,
    keep_up: float = 0.95,
) -> Verdict:
    """Whether a hold at `rate` spans/s was steady (module doc). Fewer than 6 samples
    cannot tell: ValueError."""
    if len(samples) < 6:
        raise ValueError(f"a hold needs at least 6 samples to be judged, got {len(samples)}")
    third = len(samples) // 3
    middle, last = samples[third : 2 * third], samples[2 * third :]
    if samples[-1].parts_refusals > 0:
        return Verdict(False, f"serve refused {samples[-1].parts_refusals} request(s) for too "
                              "many parts")  # fmt: skip
    for s in samples[third:]:
        over = {t: n for t, n in s.parts.items() if limit and n > limit}
        if over:
            table, n = max(over.items(), key=lambda kv: kv[1])
            return Verdict(
                False, f"{table} reached {n} active parts at {s.t_s:.0f} s (limit {limit})"
            )
    for table in sorted({t for s in samples for t in s.parts}):
        before = statistics.median(s.parts.get(table, 0) for s in middle)
        after = statistics.median(s.parts.get(table, 0) for s in last)
        allowed = before + max(tol_parts, tol_frac * before)
        if after > allowed:
            return Verdict(False, f"{table} climbing: median {before:g} -> {after:g} active parts "
                                  f"(allowed up to {allowed:g})")  # fmt: skip
    before = statistics.median(s.acked - s.stored for s in middle)
    after = statistics.median(s.acked - s.stored for s in last)
    allowed = before + max(2 * rate, tol_frac * before)
    if after > allowed:
        return Verdict(False, f"store behind: median {before:,.0f} -> {after:,.0f} spans "
                              f"acknowledged but not stored (allowed up to {allowed:,.0f})")  # fmt: skip
    start, end = samples[third], samples[-1]
    span_s = end.t_s - start.t_s
    acked, stored = end.acked - start.acked, end.stored - start.stored
    if span_s <= 0 or acked <= 0:
        return Verdict(False, "nothing acknowledged after the first third")
    if acked / span_s < keep_up * rate:
        return Verdict(False, f"clients held back: {acked / span_s:,.0f} spans/s acknowledged "
                              f"of {rate:,.0f} asked")  # fmt: skip
    return Verdict(True, f"parts flat, {stored / span_s:,.0f} spans/s stored")


def next_rate(
    holds: Sequence[Hold],
    capacity: float,
    *,
    start: float = 0.9,
    factor: float = 0.75,
    refine: int = 2,
    floor: float = 0.05,
) -> float | None:
    """The next rate (spans/s) to hold, or None when the search is done (module doc).
    ValueError on a non-positive capacity or factors outside (0, 1]."""
    if capacity <= 0 or not 0 < start <= 1 or not 0 < factor < 1:
        raise ValueError(f"capacity > 0, 0 < start <= 1, 0 < factor < 1: got {capacity}, "
                         f"{start}, {factor}")  # fmt: skip
    if not holds:
        return start * capacity
    held = [h.rate for h in holds if h.verdict.holds]
    if not held:
        lowest = min(h.rate for h in holds)
        nxt = lowest * factor
        return nxt if nxt >= floor * capacity else None
    lo = max(held)
    above = [h.rate for h in holds if not h.verdict.holds and h.rate > lo]
    if not above:
        return None  # the highest rate tried held: nothing above it failed
    hi = min(above)
    if (hi - lo) / hi <= 0.1 or len(holds) - _bracketed_at(holds) >= refine:
        return None
    return (lo + hi) / 2


def _bracketed_at(holds: Sequence[Hold]) -> int:
    """How many holds it took to have a rate that held below one that did not."""
    for k in range(1, len(holds) + 1):
        held = [h.rate for h in holds[:k] if h.verdict.holds]
        if held and any(not h.verdict.holds and h.rate > max(held) for h in holds[:k]):
            return k
    return len(holds)


def sustained(holds: Sequence[Hold]) -> float | None:
    """The highest rate that held (spans/s), None when none did."""
    return max((h.rate for h in holds if h.verdict.holds), default=None)


def parts_table(samples: Sequence[Sample], tables: Sequence[str] = WRITE_TABLES) -> str:
    """The active parts per table over a hold, one row per sample, as text with units."""
    head = ["t (s)", *tables]
    rows = [[f"{s.t_s:.0f}", *(str(s.parts.get(t, 0)) for t in tables)] for s in samples]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "active parts per table (count, in the table's fullest partition; system.parts, active):",
        "  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
