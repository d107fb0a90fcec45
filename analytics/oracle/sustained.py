"""sustained_rejections and consumer_stalled in plain Python over transition rows: the oracle
analytics/_sql/sustained.py and analytics/_sql/stall.py are tested against, written from
docs/metrics.md with exact fractions (no SQL, no masks, no window read around the window:
every stored row is looked at).

Rows as in analytics.oracle.topology (the handoff_transitions columns, `time_ns` in
integer nanoseconds, `attributes` the map as stored). A handoff is its (tenant, handoff_id)
rows; its envelope (to_agent, topology, capabilities, queue) the greatest value over its
counted create rows, as the summary keeps it. Only thresholds are shared with the SQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from analytics._sql.sustained import HOUR_S, SustainedThresholds
from analytics.oracle.audit import attrs, is_create
from analytics.oracle.funnel import Row, counted, facts
from analytics.oracle.spikes import envelope
from analytics.oracle.topology import parse_int
from collector import semconv as sc

__all__ = ["SustainedRun", "consumer_stalled_ids", "sustained_ids", "sustained_runs"]

_NS = 1_000_000_000
_HOUR_NS = HOUR_S * _NS


@dataclass(frozen=True, slots=True)
class SustainedRun:
    """One run of at least `hours` consecutive holding hours of one group: hour indexes
    first..last (start = first x 3600 s after the epoch), `ongoing` (the hour after `last`
    had not ended at as_of), counts over the run's hours, `handoffs` the rejected settled
    (tenant, handoff_id) of the window's cohort in it, sorted."""

    first: int
    last: int
    ongoing: bool
    to_agent: str
    capability: str
    settled: int
    rejected: int
    handoffs: tuple[tuple[str, str], ...]


def _by_handoff(rows: Iterable[Row]) -> dict[tuple[str, str], list[Row]]:
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), str(r["handoff_id"]))].append(r)
    return by_h


def sustained_runs(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, as_of_ns: int, th: SustainedThresholds
) -> list[SustainedRun]:
    """The runs that overlap the hours of [start_ns, end_ns), sorted by first hour, to_agent,
    capability."""
    # (to_agent, capability) -> hour -> [settled, rejected, window ids]
    groups: dict[tuple[str, str], dict[int, list[Any]]] = defaultdict(dict)
    for key, hr in _by_handoff(rows).items():
        f = facts(key[1], hr, as_of_ns=as_of_ns)
        if f.created_ns is None or not f.settled:
            continue
        to_agent, caps = envelope(hr)
        for cap in caps or [""]:  # a capability listed twice counts twice, as in SQL
            cell = groups[(to_agent, cap)].setdefault(f.created_ns // _HOUR_NS, [0, 0, set()])
            cell[0] += 1
            if f.rejected:
                cell[1] += 1
                if start_ns <= f.created_ns < end_ns:
                    cell[2].add(key)
    first_w, last_w = start_ns // _HOUR_NS, -(-end_ns // _HOUR_NS) - 1
    now = as_of_ns // _HOUR_NS
    out = []
    for (to_agent, cap), hours in groups.items():
        held = sorted(b for b, (n, r, _ids) in hours.items() if th.holds(n, r))
        runs: list[list[int]] = []
        for b in held:
            if runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        for run in runs:
            if len(run) < th.hours or run[-1] < first_w or run[0] > last_w:
                continue
            cells = [hours[b] for b in run]
            out.append(
                SustainedRun(
                    first=run[0],
                    last=run[-1],
                    ongoing=run[-1] + 1 >= now,
                    to_agent=to_agent,
                    capability=cap,
                    settled=sum(c[0] for c in cells),
                    rejected=sum(c[1] for c in cells),
                    handoffs=tuple(sorted({k for c in cells for k in c[2]})),
                )
            )
    return sorted(out, key=lambda s: (s.first, s.to_agent, s.capability))


def sustained_ids(rows: Iterable[Row], **kw: Any) -> list[tuple[str, str]]:
    """The (tenant, handoff_id) sustained_rejections flags (sustained_runs' keywords), sorted."""
    return sorted({k for s in sustained_runs(rows, **kw) for k in s.handoffs})


def _queue_rows(rows: Sequence[Row]) -> tuple[str, int | None]:
    """The envelope's queue name (greatest, "" when absent) and offset (greatest, None)."""
    cr = [r for r in rows if is_create(r)]
    name = max((str(attrs(r).get(sc.QUEUE_NAME, "")) for r in cr), default="")
    offs = [o for r in cr if (o := parse_int(attrs(r).get(sc.QUEUE_OFFSET))) is not None]
    return name, max(offs) if offs else None


def consumer_stalled_ids(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, as_of_ns: int, stall_s: int
) -> list[tuple[str, str]]:
    """The (tenant, handoff_id) consumer_stalled flags among the cohort (first counted create
    in [start_ns, end_ns)), sorted."""
    all_rows = list(rows)
    by_h = _by_handoff(all_rows)
    # every create / accept row's queue position: (tenant, queue) -> [(time, offset)]
    ahead: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for r in all_rows:
        if r["event"] not in ("create", "accept"):
            continue
        a = attrs(r)
        offs = [parse_int(a.get(sc.QUEUE_OFFSET)), parse_int(a.get(sc.QUEUE_HEAD_OFFSET))]
        if offs == [None, None]:
            continue
        off = max(o for o in offs if o is not None)
        ahead[(str(r.get("tenant", "default")), str(a.get(sc.QUEUE_NAME, "")))].append(
            (int(r["time_ns"]), off)
        )
    out = []
    for (tenant, hid), hr in by_h.items():
        f = facts(hid, hr, as_of_ns=as_of_ns)
        if f.created_ns is None or not start_ns <= f.created_ns < end_ns:
            continue
        cr = [r for r in hr if counted(r) and r["event"] == "create"]
        topology = max(str(r.get("topology") or "") for r in cr)
        to_agent = max(str(r.get("to_agent") or "") for r in cr)
        withdrawn = bool(f.reached & {"canceled", "escalated"})
        if topology != "shared_queue" or not to_agent or f.a or f.rejected or withdrawn:
            continue
        if as_of_ns - f.created_ns <= stall_s * _NS:
            continue
        queue, offset = _queue_rows(hr)
        if offset is None:
            continue
        if any(f.created_ns < t <= as_of_ns and off > offset for t, off in ahead[(tenant, queue)]):
            out.append((tenant, hid))
    return sorted(out)
