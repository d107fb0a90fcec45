"""serve's settle thread: keeps the anomaly flags of stored handoffs settled (sql/013,
analytics._sql.settled), so an anomaly query recomputes only what came in since.

Every `every_s` seconds it runs one settle: the handoffs touched since the watermark, up to
`lag_s` before the store's clock. Errors of the store are logged and retried at the next
tick (the watermark only moves once a settle's flags are written); the thread never dies.
`stats` counts settles, handoffs recomputed and errors, and keeps the last settle's time and
watermark; `collect` gives them to serve's /metrics (handoffs_settle_*).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from analytics import settle

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["Settler"]

log = logging.getLogger("handoffs.serve.settle")
#: a settle taking this long (ms) is logged
_SAY_ABOVE_MS = 5_000


class Settler:
    """The settle thread; `start()`, `stop()`, `stats`. ValueError on a non-positive
    interval or a negative lag."""

    def __init__(
        self, connect: Callable[[], Client], database: str, *, every_s: float, lag_s: float
    ) -> None:
        if every_s <= 0 or lag_s < 0:
            raise ValueError(f"settle every_s must be > 0 and lag_s >= 0, got {every_s}, {lag_s}")
        self._connect = connect
        self._db = database
        self.every_s = every_s
        self.lag_s = lag_s
        self._client: Client | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="anomaly-settle", daemon=True)
        self.stats: dict[str, float] = {
            "settles": 0, "handoffs": 0, "errors": 0, "last_ms": 0.0, "watermark_ms": 0,
        }  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def collect(self) -> Iterator[Any]:
        """prometheus-client collector: the settle counters (registered on serve's /metrics)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for key, doc in (
            ("settles", "settles of the anomaly flags run"),
            ("handoffs", "handoffs whose anomaly flags a settle recomputed"),
            ("errors", "settles that failed (retried at the next tick)"),
        ):
            yield CounterMetricFamily(f"handoffs_settle_{key}", doc, value=self.stats[key])
        yield GaugeMetricFamily(
            "handoffs_settle_last_seconds",
            "duration of the last settle",
            value=float(self.stats["last_ms"]) / 1000,
        )
        yield GaugeMetricFamily(
            "handoffs_settle_watermark_timestamp_seconds",
            "Unix time before which every stored handoff's anomaly flags are settled (0 = none; "
            "not moved while nothing new is stored)",
            value=float(self.stats["watermark_ms"]) / 1000,
        )

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._client is not None:
            self._client.close()

    def tick(self) -> None:
        """One settle; raises what the store raised."""
        if self._client is None:
            self._client = self._connect()
        done = settle(self._client, database=self._db, lag_s=self.lag_s)
        if done is not None:
            self.stats["settles"] += 1
            self.stats["handoffs"] += done.handoffs
            self.stats["last_ms"] = round(done.elapsed_ms, 1)
            self.stats["watermark_ms"] = done.until_ms
            if done.elapsed_ms >= _SAY_ABOVE_MS:  # a first settle of a big store, a backlog
                log.warning("settle: %d handoffs' anomaly flags settled in %.1f s",
                            done.handoffs, done.elapsed_ms / 1000)  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tick()
            except Exception as exc:  # the store failing: retried at the next tick
                self.stats["errors"] += 1
                log.warning("settle: %s", str(exc).splitlines()[0][:300] if str(exc) else exc)
                if self._client is not None:
                    self._client.close()
                self._client = None
