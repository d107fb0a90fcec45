"""serve's own telemetry: every refused request logged (rate-limited) and counted, and the
receiver's state as Prometheus metrics on `GET /metrics` (the OTel Collector's own
`otelcol_receiver_*` / `otelcol_exporter_*` metrics are the model).

Pure parts, tested with plain values: `credential_label` (which credential a request showed,
never the token itself), `LogLimiter` (how many lines a reason may log per interval), and
`LatencyHistogram` (cumulative buckets). `Telemetry` is the thin shell over
prometheus-client; it reads the ingestor's counters at scrape time, so nothing on the
request path pays for a metric it does not change.

Metric names (all prefixed `handoffs_`):
- `receiver_requests_total{transport,status}`: every answered export request (status is
  the HTTP code, or the gRPC code name);
- `receiver_refused_requests_total{transport,status,reason}`: the refused ones, by reason;
- `receiver_accepted_spans_total`, `receiver_rejected_spans_total{reason}`,
  `stored_spans_total`: spans acknowledged, refused per span (partial_success), stored;
  `receiver_duplicate_requests_total`: acknowledged resends of a stored body (kept once);
- `spool_backlog_bytes`, `spool_oldest_unstored_age_seconds`, `queue_requests`;
- `store_write_duration_seconds` (histogram), `store_errors_total`,
  `parked_batches_total`, `store_up`.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

__all__ = [
    "LatencyHistogram",
    "LogLimiter",
    "Refusal",
    "Telemetry",
    "credential_label",
]

log = logging.getLogger("handoffs.refusals")

#: upper bounds of the store write latency buckets, seconds
WRITE_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: a reason logs at most this many lines per LOG_INTERVAL_S; the rest are counted and summed up
LOG_BURST: Final = 5
LOG_INTERVAL_S: Final = 10.0


def credential_label(token: str | None, tokens: Mapping[str, str]) -> str:
    """Which credential a request showed, safe to log: `tenant <name>` for a known token,
    `unknown token sha256:<8 hex>` for an unknown one (enough to tell two apart), `none`."""
    if not token:
        return "none"
    tenant = tokens.get(token)
    if tenant is not None:
        return f"tenant {tenant}"
    return f"unknown token sha256:{hashlib.sha256(token.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused request. `status`: HTTP code as text ("401") or gRPC code name."""

    transport: str
    status: str
    reason: str
    message: str
    client: str = ""
    user_agent: str = ""
    credential: str = "none"


@dataclass(slots=True)
class LogLimiter:
    """At most `burst` log lines per key in any `interval_s` window (clock passed in)."""

    burst: int = LOG_BURST
    interval_s: float = LOG_INTERVAL_S
    _windows: dict[str, tuple[float, int, int]] = field(default_factory=dict)

    def admit(self, key: str, now: float) -> tuple[bool, int]:
        """(log this one?, how many of this key were suppressed since the last logged line)."""
        start, logged, suppressed = self._windows.get(key, (now, 0, 0))
        if now - start >= self.interval_s:
            start, logged = now, 0
        if logged < self.burst:
            self._windows[key] = (start, logged + 1, 0)
            return True, suppressed
        self._windows[key] = (start, logged, suppressed + 1)
        return False, 0


class LatencyHistogram:
    """Cumulative-bucket histogram of durations in seconds; thread-safe, O(log buckets)."""

    def __init__(self, bounds: Sequence[float] = WRITE_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """([(upper bound as text, cumulative count), ..., ("+Inf", total)], sum in seconds)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
            running += n
            out.append((bound, running))
        return out, total


class Watched(Protocol):
    """What telemetry reads at scrape time (ingest.Ingestor is one)."""

    @property
    def write_latency(self) -> LatencyHistogram: ...

    def health(self) -> dict[str, Any]: ...


class Telemetry:
    """Counts answers and refusals; logs refusals (rate-limited); renders /metrics.

    `clock` (monotonic seconds) is for tests of the log limiter.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "handoffs_receiver_requests",
            "Export requests answered, by transport and status",
            ["transport", "status"],
            registry=self.registry,
        )
        self._refused = Counter(
            "handoffs_receiver_refused_requests",
            "Export requests refused, by transport, status and reason",
            ["transport", "status", "reason"],
            registry=self.registry,
        )
        self._counts: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()
        self._limiter = LogLimiter()
        self._clock = clock
        self._ingestor: Watched | None = None

    def watch(self, ingestor: Watched) -> None:
        """Report `ingestor`'s spans, spool, queue and store state at each scrape."""
        self._ingestor = ingestor
        self.registry.register(_IngestorCollector(ingestor))

    def answered(self, transport: str, status: str) -> None:
        self._requests.labels(transport, status).inc()

    def refused(self, r: Refusal) -> None:
        """Count `r` (and its answer) and log it unless its reason logged too often lately."""
        self._requests.labels(r.transport, r.status).inc()
        self._refused.labels(r.transport, r.status, r.reason).inc()
        key = (r.transport, r.status, r.reason)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            ok, suppressed = self._limiter.admit(f"{r.transport}/{r.reason}", self._clock())
        if ok:
            log.warning(
                "refused %s %s (%s) from %s, user agent %r, credential %s: %s%s",
                r.transport,
                r.status,
                r.reason,
                r.client or "?",
                r.user_agent[:200],
                r.credential,
                r.message[:300],
                f" [{suppressed} more like it not logged]" if suppressed else "",
            )

    def refusal_counts(self) -> dict[str, int]:
        """Refusals so far as {'<transport> <status> <reason>': count} (for /health)."""
        with self._lock:
            return {" ".join(k): v for k, v in sorted(self._counts.items())}

    def exposition(self) -> tuple[bytes, str]:
        """The metrics page and its Content-Type (Prometheus text format 0.0.4)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _IngestorCollector:
    """Reads the ingestor's counters when Prometheus scrapes (nothing kept twice)."""

    def __init__(self, ingestor: Watched) -> None:
        self._ingestor = ingestor

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        h = self._ingestor.health()
        yield CounterMetricFamily(
            "handoffs_receiver_accepted_spans",
            "Spans in acknowledged requests (durably spooled)",
            value=h.get("spans", 0),
        )
        rejected = CounterMetricFamily(
            "handoffs_receiver_rejected_spans",
            "Spans refused one by one in acknowledged requests (OTLP partial_success)",
            labels=["reason"],
        )
        rejected.add_metric(["invalid_span"], h.get("rejected", 0))
        yield rejected
        yield CounterMetricFamily(
            "handoffs_stored_spans", "Spans written to the store", value=h.get("stored", 0)
        )
        yield CounterMetricFamily(
            "handoffs_receiver_duplicate_requests",
            "Acknowledged requests whose body was already stored (a client's resend), not stored twice",
            value=h.get("duplicate_batches", 0),
        )
        yield GaugeMetricFamily(
            "handoffs_spool_backlog_bytes",
            "Bytes of acknowledged requests in the spool not yet stored",
            value=h.get("spool_backlog_bytes", 0),
        )
        yield GaugeMetricFamily(
            "handoffs_spool_oldest_unstored_age_seconds",
            "Age of the oldest acknowledged request not yet stored (0 when none)",
            value=h.get("spool_oldest_unstored_age_s", 0.0),
        )
        yield GaugeMetricFamily(
            "handoffs_queue_requests",
            "Acknowledged requests waiting for the writer",
            value=h.get("queued", 0),
        )
        yield CounterMetricFamily(
            "handoffs_store_errors",
            "Store writes that failed (each retried, or parked)",
            value=h.get("store_errors", 0),
        )
        yield CounterMetricFamily(
            "handoffs_parked_batches",
            "Requests the store refused every time, kept in spool/dead",
            value=h.get("parked_batches", 0),
        )
        yield GaugeMetricFamily(
            "handoffs_store_up",
            "1 while the store takes writes, 0 while writes fail",
            value=1 if h.get("status") == "ok" else 0,
        )
        buckets, total = self._ingestor.write_latency.snapshot()
        yield HistogramMetricFamily(
            "handoffs_store_write_duration_seconds",
            "Duration of one store write (a group of requests), seconds",
            buckets=buckets,
            sum_value=total,
        )
