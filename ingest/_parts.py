"""Active parts per table, and the gate that refuses new requests before the engine does.

Every write makes a new part in each table it reaches (otel_traces, handoff_transitions and
the tables its views fill, transition_ledger, ingest_batches); background merges fold them
together. When writes outpace merges, parts pile up, and the engine first slows inserts into
a partition holding more than `parts_to_delay_insert` active parts (1,000 by default), then
refuses them past `parts_to_throw_insert` (3,000: "Too many parts"), at which point serve
holds acknowledged requests it cannot store. So serve stops taking new ones first: while
some table's fullest partition holds more than `limit` active parts (HANDOFFS_MAX_ACTIVE_PARTS,
default 300), the receivers answer 503 + Retry-After (gRPC UNAVAILABLE + RetryInfo), reason
`too_many_parts`, and clients retry. What was acknowledged is unaffected: the writer keeps
storing the spool, which is bounded (its writes add at most a few hundred parts on top of
the limit, still below the engine's 1,000).

Cost: the watch thread reads system.parts (one GROUP BY over the database's active parts,
~2 ms) at most every `every_s` while the store is being written or an episode lasts, and
every `idle_s` otherwise (merges only lower the counts). A failed read is logged and lets
requests through (the engine's own refusal is then the backstop: a store error, 503).

Pure parts, tested with plain values: `snapshot_from_rows`, `overload`, `episode_note`,
`Cadence.due`, `limit_problem`. `PartsWatch` is the shell: its thread, `admit` (the
receivers' gate) and `collect` (serve's /metrics: `handoffs_store_active_parts{table}`, the
limit, whether it refuses; the refusals themselves are
`handoffs_receiver_refused_requests_total{reason="too_many_parts"}`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from foundation.store import StoreUnavailable

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "PARTS_RETRY_AFTER_S",
    "Cadence",
    "EngineLimits",
    "PartsSnapshot",
    "PartsWatch",
    "TableParts",
    "TooManyParts",
    "episode_note",
    "limit_problem",
    "overload",
    "snapshot_from_rows",
]

log = logging.getLogger("handoffs.parts")

#: seconds a refused client is asked to wait: merges free parts over seconds, not
#: milliseconds (an idle engine looks for merges every 5 s: merge_selecting_sleep_ms)
PARTS_RETRY_AFTER_S: Final = 5
#: the engine's defaults (system.merge_tree_settings), used when they cannot be read
ENGINE_DEFAULTS: Final = (1000, 3000)

_PARTS_SQL: Final = """
SELECT table, partition_id, count() AS parts
FROM system.parts
WHERE database = {db:String} AND active
GROUP BY table, partition_id
"""
_LIMITS_SQL: Final = """
SELECT name, value FROM system.merge_tree_settings
WHERE name IN ('parts_to_delay_insert', 'parts_to_throw_insert')
"""


class TooManyParts(StoreUnavailable):
    """A table's partition holds more active parts than serve's limit: answer 503 (gRPC
    UNAVAILABLE) with `retry_after_s`, reason `too_many_parts`."""

    def __init__(self, message: str, retry_after_s: int = PARTS_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class TableParts:
    """One table's fullest partition: its id and its active parts (count)."""

    table: str
    partition: str
    active: int


@dataclass(frozen=True, slots=True)
class PartsSnapshot:
    """Active parts of every table of a database: one TableParts per table, by name."""

    tables: tuple[TableParts, ...] = ()

    def fullest(self) -> TableParts | None:
        """The table partition with the most active parts (ties: the first table by name)."""
        return max(self.tables, key=lambda t: t.active, default=None)


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's per-partition limits: inserts slowed above `delay_at` active parts,
    refused above `throw_at`."""

    delay_at: int
    throw_at: int


def snapshot_from_rows(rows: Iterable[tuple[str, str, int]]) -> PartsSnapshot:
    """(table, partition id, active parts) rows -> each table's fullest partition, tables by
    name (ties within a table: the smaller partition id)."""
    best: dict[str, TableParts] = {}
    for table, partition, n in rows:
        cur = best.get(table)
        if cur is None or (int(n), cur.partition) > (cur.active, partition):
            best[table] = TableParts(table, partition, int(n))
    return PartsSnapshot(tuple(best[t] for t in sorted(best)))


def overload(snapshot: PartsSnapshot, limit: int) -> TableParts | None:
    """The fullest table partition when it holds more than `limit` active parts, else None
    (always None for limit 0: no limit). ValueError on a negative limit."""
    if limit < 0:
        raise ValueError(f"the active parts limit must be >= 0, got {limit}")
    top = snapshot.fullest()
    return top if limit and top is not None and top.active > limit else None


def limit_problem(limit: int, engine: EngineLimits) -> str | None:
    """Why `limit` does not protect the store (None when it does): it must be below the
    engine's delay threshold, or the engine slows (then refuses) inserts before serve
    refuses requests."""
    if limit == 0:
        return (f"no active parts limit: under load merges cannot follow, inserts slow down "
                f"past {engine.delay_at} parts in a partition and fail past {engine.throw_at}")  # fmt: skip
    if limit >= engine.delay_at:
        return (f"the active parts limit {limit} is not below the engine's "
                f"parts_to_delay_insert ({engine.delay_at}; refusal at {engine.throw_at}): the "
                "engine slows inserts before serve refuses new requests")  # fmt: skip
    return None


def episode_note(
    before: TableParts | None, snapshot: PartsSnapshot, *, limit: int, engine: EngineLimits
) -> str | None:
    """The log line when refusing starts (`before` None, `snapshot` over the limit) or ends
    (`before`: the partition over the limit at the previous read, `snapshot` within it); None
    while it goes on or does not run: one line each way per episode."""
    now = overload(snapshot, limit)
    if before is None and now is not None:
        return (f"too many parts: table {now.table} holds {now.active} active parts in "
                f"partition {now.partition!r} (limit {limit}; the engine slows inserts past "
                f"{engine.delay_at}, refuses them past {engine.throw_at}): new requests get "
                f"503 + Retry-After until merges catch up")  # fmt: skip
    if before is not None and now is None:
        top = snapshot.fullest()
        where = f"table {top.table} at {top.active}" if top is not None else "no parts"
        return (f"parts back within the limit of {limit} (fullest partition now: {where}; "
                f"table {before.table} was at {before.active}): accepting requests again")  # fmt: skip
    return None


@dataclass(frozen=True, slots=True)
class Cadence:
    """When the watch reads system.parts: every `every_s` seconds while writes happen or
    while it refuses, else every `idle_s` (merges alone only lower the counts)."""

    every_s: float = 1.0
    idle_s: float = 30.0

    def due(self, now: float, last: float | None, *, wrote: bool, refusing: bool) -> bool:
        """`now`, `last` (the previous read; None: never) in seconds of one clock."""
        if last is None:
            return True
        waited = now - last
        return waited >= (self.every_s if wrote or refusing else self.idle_s)


class PartsWatch:
    """The watch thread (module doc): `start()`, `stop()`, `tick()` (one read, for tests),
    `admit()` (raises TooManyParts while refusing), `collect()` (a prometheus-client
    collector). `connect` opens a client on the store; `writes` returns a count that grows
    with each store write (serve: the ingestor's); `clock`: monotonic seconds. ValueError on
    a negative limit or a non-positive cadence."""

    def __init__(
        self,
        connect: Callable[[], Client],
        database: str,
        *,
        limit: int,
        writes: Callable[[], int] = lambda: 0,
        cadence: Cadence | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cadence = cadence or Cadence()
        if limit < 0 or cadence.every_s <= 0 or cadence.idle_s <= 0:
            raise ValueError(f"PartsWatch: limit >= 0 and positive periods, got {limit}, {cadence}")
        self._connect, self._db, self.limit = connect, database, limit
        self._writes, self._cadence, self._clock = writes, cadence, clock
        self._client: Client | None = None
        self.engine = EngineLimits(*ENGINE_DEFAULTS)
        self._engine_read = False
        self.snapshot = PartsSnapshot()
        #: the table partition over the limit while refusing (one reference: read unlocked)
        self.over: TableParts | None = None
        self._last: float | None = None
        self._writes_seen = -1
        self._failing = False
        self.stats = {"reads": 0, "errors": 0}
        self._lock = threading.Lock()
        self._refused = 0  # requests refused in the running episode (logged at its end)
        self._since = 0.0  # when the running episode began (clock seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the gate

    def admit(self) -> None:
        """Raise TooManyParts while a table is over the limit (called per request: reads
        one attribute)."""
        over = self.over
        if over is not None:
            with self._lock:
                self._refused += 1
            raise TooManyParts(
                f"too many parts: table {over.table} holds {over.active} active parts in one "
                f"partition (serve's limit {self.limit}); merges are behind, retry later"
            )

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="parts-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread, close its client. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _run(self) -> None:
        period = min(self._cadence.every_s, self._cadence.idle_s)
        while not self._stop.wait(period):
            now, writes = self._clock(), self._writes()
            wrote = writes != self._writes_seen
            if not self._cadence.due(now, self._last, wrote=wrote, refusing=self.over is not None):
                continue
            self.tick()

    def tick(self) -> PartsSnapshot | None:
        """Read system.parts once and refuse or admit from now on. None when the read
        failed: then requests are admitted (the engine's own refusal is the backstop), the
        failure is counted and logged once per outage, and the next read reconnects."""
        try:
            return self._read()
        except Exception as exc:
            self.stats["errors"] += 1
            self._forget(exc)
            return None

    def _read(self) -> PartsSnapshot:
        writes = self._writes()
        if self._client is None:
            self._client = self._connect()
        if not self._engine_read:
            self.engine = _engine_limits(self._client)
            self._engine_read = True
            problem = limit_problem(self.limit, self.engine)
            if problem:
                log.warning("serve: %s", problem)
        rows = self._client.query(_PARTS_SQL, parameters={"db": self._db}).result_rows
        snap = snapshot_from_rows((str(t), str(p), int(n)) for t, p, n in rows)
        note = episode_note(self.over, snap, limit=self.limit, engine=self.engine)
        self.snapshot, self.over = snap, overload(snap, self.limit)
        self._last, self._writes_seen = self._clock(), writes
        self.stats["reads"] += 1
        if self._failing:
            log.info("parts watch: system.parts readable again")
            self._failing = False
        if note:
            with self._lock:
                refused, self._refused = self._refused, 0
            started, self._since = self._since, self._clock()
            took = (
                ""
                if self.over is not None
                else (f" after {self._since - started:.1f} s and {refused} refused request(s)")
            )
            log.warning("serve: %s%s", note, took)
        return snap

    def _forget(self, exc: Exception) -> None:
        """After a failed read: admit requests, reconnect next time, log once per outage."""
        if not self._failing:
            first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            log.warning("parts watch: cannot read system.parts (%s); requests are admitted "
                        "until it can", first)  # fmt: skip
            self._failing = True
        if self.over is not None:
            log.warning("serve: admitting requests again while system.parts cannot be read "
                        "(table %s was over the limit)", self.over.table)  # fmt: skip
        self.over = None
        with self._lock:
            self._refused = 0
        self._last = self._clock()
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                log.debug("parts watch: closing the client failed", exc_info=True)
            self._client = None

    # ------------------------------------------------------------ /metrics

    def collect(self) -> Iterator[Any]:
        """prometheus-client collector: active parts per table, the limit, refusing or not."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        parts = GaugeMetricFamily(
            "handoffs_store_active_parts",
            "Active parts in the table's fullest partition (the engine's too-many-parts "
            "limits count per partition), at serve's last read of system.parts",
            labels=["table"],
        )
        for t in self.snapshot.tables:
            parts.add_metric([t.table], t.active)
        yield parts
        yield GaugeMetricFamily(
            "handoffs_store_active_parts_limit",
            "Active parts in one partition above which serve refuses new requests "
            "(503, reason too_many_parts); 0 = no limit",
            value=self.limit,
        )
        yield GaugeMetricFamily(
            "handoffs_store_parts_refusing",
            "1 while serve refuses new requests for too many parts, else 0",
            value=0 if self.over is None else 1,
        )
        yield CounterMetricFamily(
            "handoffs_store_parts_read_errors",
            "Reads of system.parts that failed (requests are admitted meanwhile)",
            value=self.stats["errors"],
        )

    def describe(self) -> list[Any]:
        return []


def _engine_limits(client: Client) -> EngineLimits:
    """The engine's parts_to_delay_insert / parts_to_throw_insert (its defaults when a
    value is missing or not a number)."""
    got: dict[str, Any] = {str(k): v for k, v in client.query(_LIMITS_SQL).result_rows}
    out = []
    for name, default in zip(("parts_to_delay_insert", "parts_to_throw_insert"), ENGINE_DEFAULTS,
                             strict=True):  # fmt: skip
        try:
            value = float(got.get(name, default))
        except (TypeError, ValueError):
            value = default
        out.append(int(value) if math.isfinite(value) and value > 0 else default)
    return EngineLimits(*out)
