"""rejection_spike in plain Python over transition rows: the oracle analytics/_sql/spikes.py
is tested against, written from docs/metrics.md with exact fractions (no SQL, no masks).

Rows are mappings as analytics.oracle.funnel takes them (the handoff_transitions columns,
`time_ns` in integer nanoseconds); a handoff is its (tenant, handoff_id) rows, its envelope
(to_agent, capabilities) the greatest value over its counted create rows, as the summary
keeps it. Only the thresholds are shared with the SQL (one source per fact).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from analytics._sql.spikes import (
    SPIKE_BASELINE_BUCKETS,
    SPIKE_BASELINE_FACTOR,
    SPIKE_BUCKET_S,
    SPIKE_MARGIN,
    SPIKE_MIN_RATE,
    SPIKE_MIN_REJECTED,
    SPIKE_MIN_SETTLED,
)
from analytics.oracle.funnel import counted, facts

__all__ = ["SpikeBucket", "envelope", "rejection_spike_ids", "rejection_spikes", "spiking"]

Row = Mapping[str, Any]
_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class SpikeBucket:
    """One spiking group in one bucket. `bucket` is the index (start = bucket x bucket_s
    seconds after the epoch); counts are settled handoffs; `handoffs` the flagged ids
    (rejected, settled, created in the window), sorted and distinct."""

    bucket: int
    to_agent: str
    capability: str
    settled: int
    rejected: int
    baseline_settled: int
    baseline_rejected: int
    handoffs: tuple[str, ...]


def _f(x: float) -> Fraction:
    return Fraction(x).limit_denominator(10_000)


def spiking(settled: int, rejected: int, baseline_settled: int, baseline_rejected: int) -> bool:
    """The spike rule over one bucket's counts and its baseline's."""
    if settled < SPIKE_MIN_SETTLED or baseline_settled < SPIKE_MIN_SETTLED:
        return False
    if rejected < SPIKE_MIN_REJECTED:
        return False
    rate = Fraction(rejected, settled)
    base = Fraction(baseline_rejected, baseline_settled)
    return rate >= _f(SPIKE_MIN_RATE) and rate >= _f(SPIKE_BASELINE_FACTOR) * base + _f(
        SPIKE_MARGIN
    )


def envelope(rows: Sequence[Row]) -> tuple[str, list[str]]:
    """A handoff's to_agent and capabilities: the greatest over its counted create rows."""
    creates = [
        r
        for r in rows
        if counted(r)
        and r["event"] == "create"
        and not r["from_state"]
        and r["to_state"] == "created"
    ]
    to_agent = max((str(r.get("to_agent") or "") for r in creates), default="")
    caps = max((list(r.get("capabilities") or []) for r in creates), default=[])
    return to_agent, caps


def rejection_spikes(
    rows: Iterable[Row],
    *,
    start_ns: int,
    end_ns: int,
    as_of_ns: int,
    bucket_s: int = SPIKE_BUCKET_S,
    baseline_buckets: int = SPIKE_BASELINE_BUCKETS,
) -> list[SpikeBucket]:
    """Spiking (group, bucket)s whose bucket overlaps [start_ns, end_ns), sorted by bucket,
    to_agent, capability."""
    width = bucket_s * _NS
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), str(r["handoff_id"]))].append(r)
    # (to_agent, capability) -> bucket -> [settled, rejected, flagged ids]
    groups: dict[tuple[str, str], dict[int, list[Any]]] = defaultdict(dict)
    for (_tenant, hid), hr in by_h.items():
        f = facts(hid, hr, as_of_ns=as_of_ns)
        if f.created_ns is None or not f.settled:
            continue
        to_agent, caps = envelope(hr)
        for cap in caps or [""]:  # a capability listed twice counts twice, as in SQL
            cell = groups[(to_agent, cap)].setdefault(f.created_ns // width, [0, 0, set()])
            cell[0] += 1
            if f.rejected:
                cell[1] += 1
                if start_ns <= f.created_ns < end_ns:
                    cell[2].add(hid)
    first, last = start_ns // width, -(-end_ns // width) - 1
    out = []
    for (to_agent, cap), buckets in groups.items():
        for b, (n, r, ids) in buckets.items():
            if not first <= b <= last:
                continue
            before = [buckets[x] for x in range(b - baseline_buckets, b) if x in buckets]
            bn, br = sum(c[0] for c in before), sum(c[1] for c in before)
            if spiking(n, r, bn, br):
                out.append(SpikeBucket(b, to_agent, cap, n, r, bn, br, tuple(sorted(ids))))
    return sorted(out, key=lambda s: (s.bucket, s.to_agent, s.capability))


def rejection_spike_ids(rows: Iterable[Row], **kw: Any) -> list[str]:
    """The handoffs rejection_spike flags (rejection_spikes' keywords), sorted, distinct."""
    return sorted({h for s in rejection_spikes(rows, **kw) for h in s.handoffs})
