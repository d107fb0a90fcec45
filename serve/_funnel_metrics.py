"""The handoff funnel on serve's `GET /metrics`, read from the store (docs/monitoring.md).

Gauges over trailing windows of the cohort (the handoffs created in the last 24 h, and 5 m to
24 h for the burn-rate alerts), as the metric contract counts them, settled as of the
refresh. Gauges, not counters: a cohort window's counts fall as handoffs age out of it, and
a handoff moves from in flight to settled; the same numbers over all time would need a scan
of the whole store at every refresh. Families (all `window`-labelled):

- `handoffs_funnel_handoffs{tenant,from_agent,to_agent,stage,window="24h"}`: per agent pair,
  the `top` pairs by volume of each tenant plus one `other`/`other` series for the rest, so at
  most (top + 1) x 8 stages (analytics.stages.EXPORTED) series per tenant;
- `handoffs_cohort_handoffs{tenant,stage,window}`: per tenant, window 5m, 30m, 1h, 6h, 24h;
- `handoffs_anomalies{tenant,kind,window="24h"}`: handoffs flagged, per anomaly kind;
- `handoffs_funnel_pairs{tenant}`: distinct pairs in the 24 h cohort before bucketing;
- `handoffs_blind_spot_traces{tenant,scope}`: traces whose first span started in the last
  24 h in which two or more agents ran and no handoff was derived (analytics.coverage);
- `handoffs_funnel_refresh_errors_total`, `handoffs_funnel_last_refresh_timestamp_seconds`,
  `handoffs_funnel_refresh_duration_seconds`.

The store is read at most once per `refresh_s`, by the scrape that finds the values older:
that scrape waits for the queries, the others answer from the cache at once (a scrape that
arrives while a refresh runs does not wait for it). A failed refresh keeps the last values
and counts the error; the next attempt is one refresh interval later.

Pure parts, tested with plain values: `top_pairs` (the bucketing) and `build_snapshot`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from analytics.stages import EXPORTED, FUNNEL
from foundation import settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from analytics.counts import AgedCounts

__all__ = [
    "METRICS_REFRESH_S",
    "METRICS_TOP_PAIRS",
    "OTHER",
    "STAGES",
    "WINDOWS",
    "FunnelCollector",
    "PairCounts",
    "Snapshot",
    "StoreLoader",
    "build_snapshot",
    "top_pairs",
]

log = logging.getLogger("handoffs.serve")

METRICS_TOP_PAIRS: Final = settings.METRICS_TOP_PAIRS
METRICS_REFRESH_S: Final = settings.METRICS_REFRESH_S

#: exported stages (the `stage` label), in this order everywhere: analytics.stages.EXPORTED
STAGES: Final = EXPORTED
#: what each `stage` label value counts, for the stage-labelled families' help
_STAGE_HELP: Final = "; ".join(f"{s.name}: {s.doc}" for s in FUNNEL if s.exported)
#: cohort windows (label, seconds) of handoffs_cohort_handoffs; the longest is the pairs' and
#: the anomalies' window
WINDOWS: Final = (("5m", 300), ("30m", 1800), ("1h", 3600), ("6h", 21600), ("24h", 86400))
PAIR_WINDOW: Final = WINDOWS[-1][0]
#: from_agent and to_agent of the series summing the pairs outside the top N
OTHER: Final = "other"


@dataclass(frozen=True, slots=True)
class PairCounts:
    """One agent pair's cohort: `volume` handoffs created, `stages` counts in STAGES order."""

    tenant: str
    from_agent: str
    to_agent: str
    volume: int
    stages: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.stages) != len(STAGES):
            raise ValueError(f"stages needs {len(STAGES)} counts, got {len(self.stages)}")


@dataclass(frozen=True, slots=True)
class CohortCounts:
    """One tenant's cohort of one window (label of WINDOWS), counts in STAGES order."""

    tenant: str
    window: str
    stages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one refresh read: the bucketed pairs, the tenants' cohorts per window,
    (tenant, kind, handoffs) anomaly counts and (tenant, distinct pairs) before bucketing."""

    pairs: tuple[PairCounts, ...] = ()
    cohorts: tuple[CohortCounts, ...] = ()
    anomalies: tuple[tuple[str, str, int], ...] = ()
    pairs_seen: tuple[tuple[str, int], ...] = ()
    blind_spots: tuple[tuple[str, str, int], ...] = ()  # (tenant, scope, traces)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def top_pairs(pairs: Iterable[PairCounts], top: int) -> tuple[PairCounts, ...]:
    """Per tenant (tenants sorted): its `top` pairs by volume (ties by from, then to agent),
    then one pair `other`/`other` summing the rest (zeros when none is left over). A real
    pair named `other`/`other` is always summed into that series, so no two series share
    labels. ValueError for top < 1 or a (tenant, from, to) given twice."""
    if top < 1:
        raise ValueError(f"top must be 1 or more, got {top}")
    by_tenant: dict[str, list[PairCounts]] = {}
    seen: set[tuple[str, str, str]] = set()
    for p in pairs:
        key = (p.tenant, p.from_agent, p.to_agent)
        if key in seen:
            raise ValueError(f"pair {key!r} given twice")
        seen.add(key)
        by_tenant.setdefault(p.tenant, []).append(p)
    out: list[PairCounts] = []
    for tenant in sorted(by_tenant):
        ranked = sorted(by_tenant[tenant], key=lambda p: (-p.volume, p.from_agent, p.to_agent))
        kept = [p for p in ranked if (p.from_agent, p.to_agent) != (OTHER, OTHER)][:top]
        kept_keys = {(p.from_agent, p.to_agent) for p in kept}
        volume, stages = 0, (0,) * len(STAGES)
        for p in ranked:
            if (p.from_agent, p.to_agent) not in kept_keys:
                volume, stages = volume + p.volume, _add(stages, p.stages)
        out += [*kept, PairCounts(tenant, OTHER, OTHER, volume, stages)]
    return tuple(out)


def build_snapshot(
    aged: Sequence[AgedCounts],
    anomalies: Mapping[str, Mapping[str, int]],
    *,
    top: int,
    blind_spots: Iterable[tuple[str, str, int]] = (),
) -> Snapshot:
    """A Snapshot from analytics.counts.funnel_by_age rows (keys tenant, from_agent,
    to_agent; ages in WINDOWS order; stages "volume" then STAGES) and {tenant: {kind:
    handoffs}}. The pairs are those of the longest window, bucketed by top_pairs."""
    last = len(WINDOWS) - 1
    pairs: list[PairCounts] = []
    tenants: dict[str, list[tuple[int, ...]]] = {}
    for a in aged:
        tenant, frm, to = a.keys
        if len(a.counts) != len(WINDOWS):
            raise ValueError(f"{a.keys!r}: {len(a.counts)} windows, expected {len(WINDOWS)}")
        if a.counts[last][0]:
            pairs.append(PairCounts(tenant, frm, to, a.counts[last][0], a.counts[last][1:]))
        sums = tenants.setdefault(tenant, [(0,) * len(STAGES)] * len(WINDOWS))
        for i, c in enumerate(a.counts):
            sums[i] = _add(sums[i], c[1:])
    cohorts = tuple(
        CohortCounts(t, label, tenants[t][i])
        for t in sorted(tenants)
        for i, (label, _s) in enumerate(WINDOWS)
    )
    seen: dict[str, int] = {}
    for p in pairs:
        seen[p.tenant] = seen.get(p.tenant, 0) + 1
    return Snapshot(
        pairs=top_pairs(pairs, top),
        cohorts=cohorts,
        anomalies=tuple(
            (t, kind, int(n)) for t in sorted(anomalies) for kind, n in anomalies[t].items()
        ),
        pairs_seen=tuple(sorted(seen.items())),
        blind_spots=tuple(sorted(blind_spots)),
    )


class StoreLoader:
    """Reads one Snapshot from the store through analytics.counts (one funnel query, and one
    query per anomaly pass and tenant) and analytics.coverage (one query). `connect` opens a client; it is kept between
    refreshes and reopened after an error. `clock`: wall seconds (the cohorts' as_of)."""

    def __init__(
        self,
        connect: Callable[[], Client],
        *,
        database: str,
        top: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if top < 1:
            raise ValueError(f"top must be 1 or more, got {top}")
        self._connect, self._database, self._top, self._clock = connect, database, top, clock
        self._client: Client | None = None

    def __call__(self) -> Snapshot:
        from analytics import Window
        from analytics.counts import anomaly_counts, funnel_by_age
        from analytics.coverage import blind_spots

        client = self._client or self._connect()
        self._client = client
        try:
            as_of = datetime.fromtimestamp(self._clock(), UTC)
            aged = funnel_by_age(
                client,
                database=self._database,
                as_of=as_of,
                ages=[timedelta(seconds=s) for _label, s in WINDOWS],
                stages=("volume", *STAGES),
            )
            window = Window(start=as_of - timedelta(seconds=WINDOWS[-1][1]), end=as_of, as_of=as_of)
            found = {
                t: anomaly_counts(client, database=self._database, window=window, tenant=t)
                for t in sorted({a.keys[0] for a in aged})
            }
            blind = blind_spots(client, database=self._database, window=window, examples=0)
        except Exception:
            self.close()
            raise
        return build_snapshot(
            aged, found, top=self._top, blind_spots=((b.tenant, b.scope, b.traces) for b in blind)
        )

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a broken client: nothing left to close
                client.close()


class FunnelCollector:
    """A prometheus-client collector over the Snapshots `load` returns, refreshed at most
    once per `refresh_s` seconds (see module doc). `clock` (wall seconds) stamps refreshes;
    `monotonic` times them."""

    def __init__(
        self,
        load: Callable[[], Snapshot],
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be 0 or more seconds, got {refresh_s}")
        self._load, self._refresh_s = load, refresh_s
        self._clock, self._monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._snapshot = Snapshot()
        self._attempted: float | None = None
        self._errors = 0
        self._last_ok = 0.0
        self._duration = 0.0

    def refresh(self) -> bool:
        """Read the store now unless another refresh runs or the last one is younger than
        refresh_s; True when new values were read."""
        if not self._lock.acquire(blocking=False):
            return False  # another scrape is reading: answer from the cache meanwhile
        try:
            start = self._monotonic()
            if self._attempted is not None and start - self._attempted < self._refresh_s:
                return False
            self._attempted = start
            try:
                snapshot = self._load()
            except Exception as exc:  # keep the last values; the counter says it failed
                self._errors += 1
                log.warning("serve: funnel metrics: reading the store failed: %s", exc)
                return False
            self._snapshot, self._last_ok = snapshot, self._clock()
            self._duration = self._monotonic() - start
            return True
        finally:
            self._lock.release()

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.refresh()
        snap = self._snapshot
        window_help = f"created in the last {PAIR_WINDOW}, settled as of the last refresh"
        pairs = GaugeMetricFamily(
            "handoffs_funnel_handoffs",
            f"Handoffs per funnel stage and agent pair, cohort {window_help}; the top pairs "
            f"by volume per tenant, the rest summed as from_agent/to_agent {OTHER!r}. "
            f"Stages: {_STAGE_HELP}",
            labels=["tenant", "from_agent", "to_agent", "stage", "window"],
        )
        for p in snap.pairs:
            for stage, n in zip(STAGES, p.stages, strict=True):
                pairs.add_metric([p.tenant, p.from_agent, p.to_agent, stage, PAIR_WINDOW], n)
        yield pairs
        cohorts = GaugeMetricFamily(
            "handoffs_cohort_handoffs",
            "Handoffs per funnel stage and tenant, cohort created in the trailing `window`, "
            f"settled as of the last refresh. Stages: {_STAGE_HELP}",
            labels=["tenant", "stage", "window"],
        )
        for c in snap.cohorts:
            for stage, n in zip(STAGES, c.stages, strict=True):
                cohorts.add_metric([c.tenant, stage, c.window], n)
        yield cohorts
        anomalies = GaugeMetricFamily(
            "handoffs_anomalies",
            f"Handoffs flagged per anomaly kind, cohort {window_help}",
            labels=["tenant", "kind", "window"],
        )
        for tenant, kind, n in snap.anomalies:
            anomalies.add_metric([tenant, kind, PAIR_WINDOW], n)
        yield anomalies
        seen = GaugeMetricFamily(
            "handoffs_funnel_pairs",
            f"Distinct agent pairs of the cohort created in the last {PAIR_WINDOW}, before "
            "the top-pairs bucketing",
            labels=["tenant"],
        )
        for tenant, n in snap.pairs_seen:
            seen.add_metric([tenant], n)
        yield seen
        blind = GaugeMetricFamily(
            "handoffs_blind_spot_traces",
            f"Traces whose first span started in the last {PAIR_WINDOW} in which two or more "
            "agents ran but no handoff was derived (no rule knows the framework), per "
            "instrumentation scope, as of the last refresh",
            labels=["tenant", "scope"],
        )
        for tenant, scope, n in snap.blind_spots:
            blind.add_metric([tenant, scope], n)
        yield blind
        yield CounterMetricFamily(
            "handoffs_funnel_refresh_errors",
            "Funnel metric refreshes that failed to read the store (the last values stay)",
            value=self._errors,
        )
        yield GaugeMetricFamily(
            "handoffs_funnel_last_refresh_timestamp_seconds",
            "Unix time of the last successful funnel metric refresh (0 = none yet)",
            value=self._last_ok,
        )
        yield GaugeMetricFamily(
            "handoffs_funnel_refresh_duration_seconds",
            "Seconds the last successful funnel metric refresh took",
            value=self._duration,
        )
