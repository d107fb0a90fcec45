"""Fleet findings by reference: which (to_agent, capability) group and which hours a fleet
kind (rejection_spike, sustained_rejections) judged when it covered one handoff, and the
sentence saying so; the resolvers analytics.evidence._why_store registers for those kinds. Each
returns (FleetRef tuple, Reason or None); `hour_of` is the reference of a fleet kind without
a resolver: each of the handoff's groups over the hour of its creation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from analytics.evidence._assemble import iso_ns
from analytics.evidence._findings import FLEET_SPAN_NS, FleetRef
from analytics.evidence._why import Reason, _when
from collector import semconv as sc

if TYPE_CHECKING:
    from analytics.evidence._evaluate import Neighbourhood

__all__ = ["hour_of", "rejection_spike", "sustained_rejections"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
Found = tuple[tuple[FleetRef, ...], Reason | None]


def _groups(n: Neighbourhood) -> list[tuple[str, str]]:
    """(to_agent, capability) groups the handoff counts in ('' when it asked for none)."""
    c = n.create
    caps = [str(x) for x in (c or {}).get("capabilities") or []] or [""]
    return [(n.envelope("to_agent"), cap) for cap in sorted(set(caps))]


def _created_ns(n: Neighbourhood) -> int:
    c = n.create
    return int(c["time_ns"]) if c else min(int(r["time_ns"]) for r in n.rows)


def hour_of(n: Neighbourhood) -> tuple[FleetRef, ...]:
    """Each of its groups over the FLEET_SPAN_NS-long span (UTC-aligned) holding its
    created time."""
    t = _created_ns(n)
    lo = t - t % FLEET_SPAN_NS
    return tuple(FleetRef(a, cap, iso_ns(lo), iso_ns(lo + FLEET_SPAN_NS)) for a, cap in _groups(n))


def rejection_spike(n: Neighbourhood) -> Found:
    """The spiking (to_agent, capability, hour) groups the handoff counts in."""
    from analytics._sql.cohort import Window
    from analytics._sql.spikes import SPIKE_BASELINE_BUCKETS, SPIKE_BUCKET_S, spikes_sql

    t = _created_ns(n)
    at = _EPOCH + timedelta(microseconds=t // 1000)
    w = Window(start=at, end=at + timedelta(microseconds=1), as_of=n.window.as_of,
               settled=n.settled().settled)  # fmt: skip
    sql = spikes_sql(
        n.db, w, tenant=False, bucket_s=SPIKE_BUCKET_S, baseline=SPIKE_BASELINE_BUCKETS
    )
    mine = set(_groups(n))
    refs, parts = [], []
    span = SPIKE_BUCKET_S * 1_000_000_000
    for b, agent, cap, settled, r, bn, br, _h in n.client.query(sql).result_rows:
        if (str(agent), str(cap)) not in mine:
            continue
        lo = int(b) * span
        refs.append(FleetRef(str(agent), str(cap), iso_ns(lo), iso_ns(lo + span)))
        parts.append(
            f"to_agent {agent}, capability {cap or '(none)'}: {r} of {settled} settled handoffs created "
            f"{_when(lo)} to {_when(lo + span)} were rejected, against {br} of {bn} in the "
            f"{SPIKE_BASELINE_BUCKETS} hours before"
        )
    if not refs:
        return hour_of(n), None
    return tuple(refs), Reason(
        "rejection_spike", "; ".join(parts), field=sc.TO_AGENT, value=n.envelope("to_agent")
    )


def sustained_rejections(n: Neighbourhood) -> Found:
    """The runs of sustained rejections of its groups that hold its created hour
    (analytics.sustained: a run still going at the package's time ends at that hour)."""
    from analytics._sql.cohort import Window
    from analytics.sustained import sustained_rejections

    t = _created_ns(n)
    at = _EPOCH + timedelta(microseconds=t // 1000)
    w = Window(start=at, end=at + timedelta(microseconds=1), as_of=n.window.as_of)
    runs = sustained_rejections(n.client, database=n.db, window=w)
    mine = set(_groups(n))
    refs, parts = [], []
    for run in runs.to_dict("records"):
        if (str(run["to_agent"]), str(run["capability"])) not in mine:
            continue
        end = run["end"] or (run["start"] + timedelta(hours=int(run["hours"])))
        lo, hi = (int((x - _EPOCH) / timedelta(microseconds=1)) * 1000 for x in (run["start"], end))
        refs.append(FleetRef(str(run["to_agent"]), str(run["capability"]), iso_ns(lo), iso_ns(hi)))
        parts.append(
            f"to_agent {run['to_agent']}, capability {run['capability'] or '(none)'}: "
            f"{run['rejected']} of {run['settled']} settled handoffs rejected over the "
            f"{run['hours']} hours from {_when(lo)}" + (" (still going)" if run["ongoing"] else "")
        )
    if not refs:
        return hour_of(n), None
    return tuple(refs), Reason(
        "sustained_rejections", "; ".join(parts), field=sc.TO_AGENT, value=n.envelope("to_agent")
    )
