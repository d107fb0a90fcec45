"""The ingest pipeline behind serve: decode -> spool (durable) -> writer thread -> store.

`Ingestor.submit` returns only after the request is on disk in the spool, so a 200 never
precedes durability. Each request is one ingest batch whose id derives from tenant and body,
so a retried request or a replayed record maps to the same batch and is stored once (known
batch ids are skipped). One writer thread takes what is queued and writes consecutive
requests of a tenant as one group (one insert per table, up to _GROUP_MAX_SPANS spans); the
group's member list is logged durably in the spool before the write, so a replay after a
crash rebuilds the same group and its dedup token. A failing store is retried with
backoff; while it fails, submit refuses new work (503) instead of accepting it blindly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ingest._decode import PROTOBUF, DecodedBatch, decode_request
from ingest._spool import Spool
from ingest._telemetry import LatencyHistogram
from ingest._writer import (
    BatchResult,
    Member,
    last_chain_hash,
    make_token,
    write_group,
    write_staged_chain,
    write_staged_data,
    write_staged_group,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest.chdb import Staged, Stager

__all__ = ["SQL_MIN_BYTES", "Ingestor", "StoreUnavailable"]

log = logging.getLogger("handoffs.ingest")
_KNOWN_BATCHES = 50_000  # batch ids remembered to keep a retried request off the chain
_MAX_QUEUED_SPANS = 40_000  # decoded / staged spans held for the writer; then submit waits
# spans per insert: 4x 5,000 (fewer parts: less fixed cost per write and fewer merges)
_GROUP_MAX_SPANS = 20_000
_PAIR_MIN_SPANS = 8_000  # a last group smaller than this is written whole (see _halves)
_PURGE_EVERY_S = 5.0  # see Ingestor._maybe_purge
_PURGE_MIN_GAP_S = 0.25
_PURGE_ABOVE_BYTES = 400 << 20


def _members(run: list[_Item]) -> list[tuple[Staged, int]]:
    """(staged request, received_at_ms) of a run's chDB-decoded requests, in order."""
    return [(x.stage, x.received_at_ms) for x in run if x.stage is not None]


def _split_in_two(run: list[_Item]) -> list[list[_Item]]:
    """`run` as two runs in order, the first with at least half of the spans."""
    total, acc, half = sum(x.decoded.spans for x in run), 0, len(run) - 1
    for i, x in enumerate(run[:-1], 1):
        acc += x.decoded.spans
        if acc * 2 >= total:
            half = i
            break
    return [run[:half], run[half:]]


def _rss_bytes() -> int:
    """This process's resident set (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_EXTRA_CLIENTS = 2  # see Ingestor._open_extra_clients
_PAIR_QUIET_S = 0.01  # ... and one is "last" when no request starts arriving for this long
#: requests acknowledged during a write are written at once with it (_write_overlapping)
#: only while serve's RSS is below this: three writes at once hold ~20-45 MB more than
#: two, and the last writes of a burst are serve's memory peak; above it they go in right
#: after the running write (two halves at once, _halves)
OVERLAP_MAX_RSS = 450 << 20
_GROUP_MAX_REQUESTS = 64
#: Smallest protobuf body chDB decodes (ingest._fast); smaller ones go through Python, whose
#: cost per request is lower: chDB's decoding queries run for the life of serve, but each
#: request still costs a few ms of fixed work (its block staged with an INSERT, the ack's
#: figures read from it), which pays off only from several hundred spans.
#: (OTel SDK batches of 512 spans are ~180 KB; a Collector's 8192-span batches ~3 MB.)
SQL_MIN_BYTES = 256 * 1024
_STAGED_WAIT_S = 0.05
_STAGED_MAX_WAIT_S = 0.5  # while requests are still being decoded (stored at most this late)


class StoreUnavailable(RuntimeError):
    """The store is failing; the caller should answer 503 and the client retry later."""


@dataclass(frozen=True, slots=True)
class _Item:
    seq: int
    batch_id: str
    received_at_ms: int
    decoded: DecodedBatch
    body: bytes | None = None
    fmt: str = ""
    stage: Staged | None = None  # when chDB decoded it (ingest._fast)


_MAX_REFUSALS = 20  # the store answered with an error this many times for one batch: park it


#: ClickHouse errors that pass: memory limit, not enough disk space (min_free_disk_bytes_to_
#: perform_insert), too many parts. The store is unavailable for a while, not refusing the data.
_TRANSIENT_CODES = frozenset({241, 243, 252})


def _is_refusal(exc: Exception) -> bool:
    """The store answered and refused (a ClickHouse error), as opposed to being unreachable
    or temporarily out of memory or disk."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    if not isinstance(exc, DatabaseError) or isinstance(exc, OperationalError):
        return False
    return getattr(exc, "code", None) not in _TRANSIENT_CODES


class Ingestor:
    """Owns the spool and the writer thread. Keyword-only `clock` (epoch seconds) for tests."""

    def __init__(
        self,
        client: Client,
        database: str,
        spool: Spool,
        *,
        source: str = "otlp-http",
        clock: Callable[[], float] = time.time,
        max_refusals: int = _MAX_REFUSALS,
        stager: Stager | None = None,
        sql_min_bytes: int = SQL_MIN_BYTES,
        purge_memory: bool = False,
        purge_under_load: bool = True,
        overlap_max_rss: int = 0,
    ) -> None:
        self.client = client
        #: embedded store: RSS from which requests acknowledged during a write are no longer
        #: written at once with it (serve passes OVERLAP_MAX_RSS; 0: no limit)
        self.overlap_max_rss = overlap_max_rss
        #: embedded store: hand the engine's freed pages back to the OS (see _maybe_purge)
        self.purge_memory = purge_memory
        #: ... also under load, past _PURGE_ABOVE_BYTES of RSS: not needed when the engine's
        #: allocator hands freed pages back within a fraction of a second by itself (serve's
        #: JE_MALLOC_CONF, serve._run.JEMALLOC_CONF); then these purges only cost CPU
        self.purge_under_load = purge_under_load
        self.stager = stager
        self.sql_min_bytes = sql_min_bytes
        self.database = database
        self.spool = spool
        self.source = source
        self._clock = clock
        self._max_refusals = max_refusals
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        # Decoded spans waiting for the writer cost memory: past _MAX_QUEUED_SPANS a request
        # (already durable in the spool) waits for room, which slows senders down.
        self._room = threading.Condition()
        self._queued_spans = 0
        self._known: OrderedDict[str, str] = OrderedDict()
        self._chain = ""
        self._store_error: str | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: stop() was called: a write that fails now is not retried (its records stay in the
        #: spool for the next start), so a stop never waits on a failing store
        self._draining = threading.Event()
        self._kept_in_spool = False  # the writer stopped with requests left for replay
        self.stats: dict[str, int] = {
            "requests": 0,
            "spans": 0,
            "stored": 0,
            "rejected": 0,
            "batches": 0,
            "duplicate_batches": 0,
            "store_errors": 0,
            "parked_batches": 0,
            "writes": 0,
            "pair_writes": 0,  # last groups written as two halves at once (_write_pair)
            "pair_fallbacks": 0,  # ... that failed and were written the usual way
            # requests stored alongside a write that was running when they arrived
            "overlapped_writes": 0,
            "overlaps_skipped_for_memory": 0,
        }
        #: cumulative wall seconds per stage (threads overlap): for operators and benchmarks
        #: duration of each store write, for /metrics (handoffs_store_write_duration_seconds)
        self.write_latency = LatencyHistogram()
        self.timings: dict[str, float] = {
            "decode_s": 0.0,
            "spool_s": 0.0,
            "queue_wait_s": 0.0,
            "store_s": 0.0,
        }
        self._lock = threading.Lock()
        self._staging = 0  # requests inside submit(): decoding, spooling or queueing
        #: connections for data written at once with the writer's own (_write_pair,
        #: _write_overlapping), opened when serve starts (see _open_extra_clients)
        self._extra: list[Client] = []
        self._extra_lock = threading.Lock()
        self._taken: list[_Item] = []  # requests _write_overlapping took off the queue
        self._purged_at = time.monotonic()  # see _maybe_purge
        self._purge_lock = threading.Lock()
        if stager is not None:
            stager.before_decode = self._purge_if_big

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Load the chain head, replay the spool left by a crash, start the writer.

        Returns the number of spool records replayed.
        """
        self._load_chain()
        if self.stager is not None:
            self.stager.setup()
            threading.Thread(
                target=self._open_extra_clients, name="ingest-connect", daemon=True
            ).start()
        groups = self.spool.groups()
        present = {rec.seq for rec in self.spool.uncommitted()}
        replayed = 0
        waiting: dict[tuple[int, ...], list[_Item]] = {}
        for rec in self.spool.uncommitted():
            h = rec.header
            item = self._prepare(
                rec.body, h["fmt"], h["tenant"], h["batch"], int(h["received_at_ms"]), rec.seq
            )
            replayed += 1
            group = groups.get(rec.seq)
            if group is None:
                self._write_items([item], log_group=False)
                continue
            # Rebuild the logged group exactly (same members, same token) before writing it.
            members = waiting.setdefault(group, [])
            members.append(item)
            if len(members) == len([q for q in group if q in present]):
                self._write_items(waiting.pop(group), log_group=False, regroup=True)
        for members in waiting.values():  # cannot happen unless the log and spool disagree
            self._write_items(members, log_group=False, regroup=True)
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()
        return replayed

    def stop(self, *, timeout: float = 60.0) -> bool:
        """Store everything queued, then stop the writer. True when drained within timeout (s).

        A write that fails once stop() was called is not retried: what it held stays in the
        spool and is replayed at the next start (False is returned), so a store that cannot
        take writes (disk below the free-space threshold, unreachable) never holds a stop.
        """
        if self._thread is None:
            return True
        self._draining.set()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        drained = not self._thread.is_alive() and not self._kept_in_spool
        self._stopping.set()
        if drained:
            with self._extra_lock:
                for c in self._extra:
                    with contextlib.suppress(Exception):
                        c.close()
                self._extra.clear()
        return drained

    def _load_chain(self) -> None:
        self._chain = last_chain_hash(self.client, self.database)
        rows = self.client.query(
            f"SELECT ingest_batch, chain_hash FROM {self.database}.ingest_batches "
            f"ORDER BY received_at DESC, ingest_batch DESC LIMIT {_KNOWN_BATCHES}"
        ).result_rows
        for bid, ch in reversed(rows):
            self._known[bid] = ch

    # ------------------------------------------------------------ request path

    def _wants_sql(self, body: bytes, fmt: str) -> bool:
        return self.stager is not None and fmt == PROTOBUF and len(body) >= self.sql_min_bytes

    def _prepare(
        self,
        body: bytes,
        fmt: str,
        tenant: str,
        batch_id: str,
        received: int,
        seq: int = -1,
    ) -> _Item:
        """Decode one request: chDB stages it when it can (ingest._fast), else ingest._decode.

        Both give the same stored rows; the Python decoder also gives the reject messages
        and raises DecodeError for a bad body.
        """
        if self.stager is not None and self._wants_sql(body, fmt):
            staged = self.stager.stage(
                body, batch_id=batch_id, received_at_ms=received, tenant=tenant
            )
            if staged is not None:
                decoded = DecodedBatch(tenant=tenant, spans=staged.spans)
                return _Item(seq, batch_id, received, decoded, body, fmt, staged)
        decoded = decode_request(body, fmt, tenant=tenant)
        return _Item(seq, batch_id, received, decoded, body, fmt)

    @contextlib.contextmanager
    def receiving(self, fmt: str, nbytes: int) -> Iterator[None]:
        """Around reading and submitting one request (the HTTP handler, from its headers): a
        protobuf body large enough for the chDB decoder is announced to it, so the writer
        waits briefly for this request before a write (see _on_the_way)."""
        if self.stager is not None and fmt == PROTOBUF and nbytes >= self.sql_min_bytes:
            with self.stager.incoming():
                yield
        else:
            yield

    def submit(self, body: bytes, fmt: str, *, tenant: str) -> DecodedBatch:
        """Decode, validate and durably spool one request; return the decoded batch.

        Raises DecodeError (bad body), SpoolFull or StoreUnavailable (answer 503).
        Empty requests are acknowledged without touching the spool.
        """
        t0 = time.perf_counter()
        with self._lock:
            self._staging += 1  # the writer may wait for this one (see _run)
        try:
            return self._submit(body, fmt, tenant=tenant, t0=t0)
        finally:
            with self._lock:
                self._staging -= 1

    def _submit(self, body: bytes, fmt: str, *, tenant: str, t0: float) -> DecodedBatch:
        batch_id = make_token(tenant, hashlib.sha256(body).hexdigest())
        received = int(self._clock() * 1000)
        item = self._prepare(body, fmt, tenant, batch_id, received)
        decoded = item.decoded
        t1 = time.perf_counter()
        with self._lock:
            self.stats["requests"] += 1
            self.stats["spans"] += decoded.spans
            self.timings["decode_s"] += t1 - t0
        if decoded.spans == 0:
            return decoded
        if self._store_error is not None:
            if item.stage is not None and self.stager is not None:
                self.stager.release([item.stage])
            raise StoreUnavailable(f"store is failing: {self._store_error}")
        header = {"tenant": tenant, "fmt": fmt, "batch": batch_id, "received_at_ms": received}
        try:
            seq = self.spool.append(header, body)  # durable when it returns; may raise SpoolFull
        except BaseException:
            if item.stage is not None and self.stager is not None:
                self.stager.release([item.stage])
            raise
        t2 = time.perf_counter()
        with self._room:
            while self._queued_spans and self._queued_spans + decoded.spans > _MAX_QUEUED_SPANS:
                self._room.wait(1.0)
            self._queued_spans += decoded.spans
        self._queue.put(replace(item, seq=seq))
        with self._lock:
            self.timings["spool_s"] += t2 - t1
            self.timings["queue_wait_s"] += time.perf_counter() - t2
        return decoded

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if self._store_error is None else "store_unavailable",
            "store_error": self._store_error,
            "queued": self._queue.qsize(),
            "spool_backlog_bytes": self.spool.backlog_bytes,
            "spool_oldest_unstored_age_s": round(self.spool.oldest_pending_age_s, 3),
            "decoder": "sql+python" if self.stager is not None else "python",
            "sql_decoded": self.stager.staged if self.stager is not None else 0,
            "sql_declined": self.stager.fallbacks if self.stager is not None else 0,
            "sql_decode_queries": self.stager.queries if self.stager is not None else 0,
            **self.stats,
            **{k: round(v, 3) for k, v in self.timings.items()},
        }

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once every accepted request is stored, False if some still are not after
        `timeout` seconds (for tests, drains and `GET /health?wait_s=`). Woken by the
        writer's last task_done, not by polling: a caller waiting costs serve no CPU."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    # ------------------------------------------------------------ writer

    def _run(self) -> None:
        while True:
            got = [self._queue.get()]
            linger_until = time.monotonic() + _STAGED_MAX_WAIT_S
            while got[-1] is not None and len(got) < _GROUP_MAX_REQUESTS:
                if sum(x.decoded.spans for x in got if x is not None) >= _GROUP_MAX_SPANS:
                    break
                try:
                    if got[-1].stage is None:
                        got.append(self._queue.get_nowait())
                        continue
                    # chDB-decoded requests cost a fixed ~0.1 s per write (query analysis,
                    # one part per table): wait a moment for more of them to share it, and
                    # longer (to _STAGED_MAX_WAIT_S) while requests are on their way (being
                    # received or decoded: counting received ones too, the 20 requests of
                    # the bench go in 5-6 writes instead of 6-7); not at all when none is
                    got.append(
                        self._queue.get(timeout=_STAGED_WAIT_S)
                        if self._on_the_way()
                        else self._queue.get_nowait()
                    )
                except queue.Empty:
                    if not self._on_the_way() or time.monotonic() >= linger_until:
                        break
            items = [x for x in got if x is not None]
            stop = len(items) != len(got)
            try:
                if items:
                    self._write_items(items)
                    self._maybe_purge()
            except Exception as exc:  # only when stopping: the records stay spooled for replay
                log.error("writer stopped, %d request(s) kept in the spool: %s", len(items), exc)
                self._kept_in_spool = True
                stop = True
            finally:
                # requests a write took from the queue meanwhile (_write_overlapping) are
                # done (stored, or kept in the spool when stopping) with this round's
                got += self._taken
                items += self._taken
                self._taken = []
                with self._room:
                    self._queued_spans -= sum(x.decoded.spans for x in items)
                    self._room.notify_all()
                for _ in got:
                    self._queue.task_done()
            if stop:
                return

    def _write_items(
        self, items: list[_Item], *, log_group: bool = True, regroup: bool = False
    ) -> None:
        """Write queued requests: consecutive same-tenant runs become groups; known batch
        ids (retries of stored requests) are skipped. `regroup`: items are one logged group."""
        runs: list[list[_Item]] = []
        placed: set[str] = set()
        later: list[_Item] = []  # same request queued twice: done once the first copy is stored
        for it in items:
            if it.batch_id in self._known:
                with self._lock:
                    self.stats["duplicate_batches"] += 1
                self._discard(it)
                continue
            if it.batch_id in placed:
                later.append(it)
                continue
            placed.add(it.batch_id)
            if (
                runs
                and runs[-1][-1].decoded.tenant == it.decoded.tenant
                and (regroup or (runs[-1][-1].stage is None) == (it.stage is None))
                and (
                    regroup
                    or sum(x.decoded.spans for x in runs[-1]) + it.decoded.spans <= _GROUP_MAX_SPANS
                )
            ):
                runs[-1].append(it)
            else:
                runs.append([it])
        for run in runs:
            run.sort(key=lambda x: x.seq)
            for x in [x for x in run if x.batch_id in self._known]:  # stored by an earlier run
                with self._lock:
                    self.stats["duplicate_batches"] += 1
                self._discard(x)
                run.remove(x)
            if not run:
                continue
            if len({x.stage is None for x in run}) > 1:  # a replayed group of both kinds
                run[:] = [self._unstage(x) for x in run]
            parts = self._halves(run) if log_group and not regroup else [run]
            planned = [(part, self._group_token(part, log=log_group)) for part in parts]
            if len(planned) == 2 and self._write_pair(planned[0], planned[1]):
                continue
            if len(planned) == 1 and log_group and not regroup and run is runs[-1]:
                self._write_overlapping(*planned[0])
                continue
            for part, token in planned:
                self._write(part, token, retry=True)
        for it in later:
            with self._lock:
                self.stats["duplicate_batches"] += 1
            self._discard(it)

    def _discard(self, item: _Item) -> None:
        """A request already stored: drop its staging table, mark it done in the spool."""
        if item.stage is not None and self.stager is not None:
            self.stager.release([item.stage])
        self.spool.commit(item.seq)

    def _unstage(self, item: _Item) -> _Item:
        """The same request decoded by ingest._decode (same rows; for mixed replay groups)."""
        if item.stage is None or self.stager is None or item.body is None:
            return item
        self.stager.release([item.stage])
        decoded = decode_request(item.body, item.fmt, tenant=item.decoded.tenant)
        return replace(item, decoded=decoded, stage=None)

    def _maybe_purge(self) -> None:
        """Hand the engine's freed pages back to the OS (SYSTEM JEMALLOC PURGE) after a write
        when no request is on its way and the last purge is _PURGE_EVERY_S old, or, under
        load, when serve's RSS passed _PURGE_ABOVE_BYTES (at most every _PURGE_MIN_GAP_S).
        jemalloc keeps freed pages for seconds; after writes they are mostly the writes'
        blocks. Not after every write: the next write faults the pages back in (measured:
        purging after each write cost ~18% of serve's CPU per span, 2 senders)."""
        if not self.purge_memory:
            return
        now = time.monotonic()
        quiet = not self._staging and self._queue.empty()
        with self._purge_lock:
            since = now - self._purged_at
            if not (since >= _PURGE_EVERY_S and quiet) and not (
                self.purge_under_load
                and since >= _PURGE_MIN_GAP_S
                and _rss_bytes() >= _PURGE_ABOVE_BYTES
            ):
                return
            self._purged_at = now
        with contextlib.suppress(Exception):
            self.client.command("SYSTEM JEMALLOC PURGE")

    def _purge_if_big(self, client: Client) -> None:
        """Before a request is decoded (on the decoding thread, with its client): under load,
        once serve's RSS passed _PURGE_ABOVE_BYTES, hand jemalloc's freed pages back first
        (at most every _PURGE_MIN_GAP_S, shared with _maybe_purge). A decode and a write
        at once are serve's memory peak; the writes' freed pages would otherwise wait for
        the writer's next purge."""
        if not (self.purge_memory and self.purge_under_load):
            return
        now = time.monotonic()
        with self._purge_lock:
            if now - self._purged_at < _PURGE_MIN_GAP_S or _rss_bytes() < _PURGE_ABOVE_BYTES:
                return
            self._purged_at = now
        with contextlib.suppress(Exception):
            client.command("SYSTEM JEMALLOC PURGE")

    def _halves(self, run: list[_Item]) -> list[list[_Item]]:
        """A chDB-decoded group written while no request arrives (none inside submit(),
        none arriving for _PAIR_QUIET_S), large enough: two groups, written at once by
        _write_pair. Their data go in on two cores that would otherwise idle: the time until
        the last acknowledged requests are stored halves (groups still queued after this one
        are split too). Otherwise the run as it is (while requests flow, the cores are busy
        decoding them)."""
        if (
            self.stager is None
            or len(run) < 2
            or any(x.stage is None for x in run)
            or self._staging
            or sum(x.decoded.spans for x in run) < _PAIR_MIN_SPANS
            or not self._quiet(_PAIR_QUIET_S)
        ):
            return [run]
        return _split_in_two(run)

    def _on_the_way(self) -> bool:
        """A request is inside submit(), or (chDB-decoded) announced by its headers."""
        return bool(self._staging) or (self.stager is not None and self.stager.receiving())

    def _quiet(self, seconds: float) -> bool:
        """True when no request starts arriving for `seconds` (polls)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._staging or (self.stager is not None and self.stager.receiving()):
                return False
            time.sleep(0.002)
        return not self._staging

    def _write_overlapping(self, run: list[_Item], token: str) -> None:
        """Write a chDB-decoded group; should requests arrive meanwhile and then none for
        _PAIR_QUIET_S (the end of a burst), take them off the queue (self._taken) and write
        their data at once on the extra connections (two halves when _PAIR_MIN_SPANS or
        more), chain rows after this group's (as _write_pair). Before, they waited for this
        write to end: the last acknowledged requests were stored one whole write later."""
        if self.stager is None or any(x.stage is None for x in run):
            self._write(run, token, retry=True)
            return
        done = threading.Event()
        errors: dict[str, BaseException | None] = {}

        def data_a() -> None:
            try:
                errors["a"] = self._staged_data(self.client, run, token)
            finally:
                done.set()

        t0 = time.perf_counter()
        t = threading.Thread(target=data_a, name="ingest-writer-a", daemon=True)
        t.start()
        more = self._followers(done, run)
        parts: list[tuple[list[_Item], str, BaseException | None]] = []
        if more:
            self._taken += more
            with self._lock:
                self.stats["overlapped_writes"] += 1
            # the end of a burst: in two halves at once when large enough (on the two extra
            # connections), so that both cores write once this group's data are in
            halves = (
                _split_in_two(more)
                if len(more) > 1 and sum(x.decoded.spans for x in more) >= _PAIR_MIN_SPANS
                else [more]
            )
            parts = self._data_at_once([(h, self._group_token(h)) for h in halves])
        t.join()
        self._chain_in_order([(run, token, errors.get("a")), *parts])
        self.timings["store_s"] += time.perf_counter() - t0

    def _group_token(self, run: list[_Item], *, log: bool = True) -> str:
        """The dedup token of a run written as one group: the batch id of a single request;
        for several, a token of their ids, logged in the spool first when `log` (a replay
        regroups them exactly; a replayed group is already logged)."""
        if len(run) == 1:
            return run[0].batch_id
        if log:
            self.spool.log_group([x.seq for x in run])
        return make_token("group", *(x.batch_id for x in run))

    def _data_at_once(
        self, planned: list[tuple[list[_Item], str]]
    ) -> list[tuple[list[_Item], str, BaseException | None]]:
        """The data of up to two staged runs, written at once on the extra connections (the
        second on a thread of its own); each run with its token and the exception its write
        raised (None when stored), in order, for _chain_in_order."""
        errors: list[BaseException | None] = [None] * len(planned)

        def data(i: int) -> None:
            run, token = planned[i]
            try:
                errors[i] = self._staged_data(self._extra_client(i), run, token)
            except Exception as exc:  # no connection: the run is written the usual way
                errors[i] = exc

        threads = [
            threading.Thread(target=data, args=(i,), name=f"ingest-writer-{'bc'[i]}", daemon=True)
            for i in range(1, len(planned))
        ]
        for t in threads:
            t.start()
        data(0)
        for t in threads:
            t.join()
        return [(run, token, errors[i]) for i, (run, token) in enumerate(planned)]

    def _followers(self, done: threading.Event, run: list[_Item]) -> list[_Item]:
        """While `done` is unset: once no request is on its way for _PAIR_QUIET_S, the
        chDB-decoded requests at the head of the queue (run's tenant, not already stored,
        up to _GROUP_MAX_SPANS), taken off the queue; [] if none before `done`, or when
        serve's RSS is at overlap_max_rss (they stay queued for the next write)."""
        tenant = run[0].decoded.tenant
        ids = {x.batch_id for x in run}
        quiet_since: float | None = None
        while not done.wait(0.005):
            if self._staging or (self.stager is not None and self.stager.receiving()):
                quiet_since = None
                continue
            now = time.monotonic()
            if quiet_since is None:
                quiet_since = now
            if now - quiet_since < _PAIR_QUIET_S:
                continue
            n, spans = 0, 0
            with self._queue.mutex:  # this thread is the only consumer: the head stays
                for it in self._queue.queue:
                    if (
                        it is None
                        or it.stage is None
                        or it.decoded.tenant != tenant
                        or it.batch_id in self._known
                        or it.batch_id in ids
                        or spans + it.decoded.spans > _GROUP_MAX_SPANS
                    ):
                        break
                    ids.add(it.batch_id)
                    spans += it.decoded.spans
                    n += 1
            if not n:
                continue
            if self.overlap_max_rss and _rss_bytes() >= self.overlap_max_rss:
                with self._lock:
                    self.stats["overlaps_skipped_for_memory"] += 1
                return []
            taken = [self._queue.get_nowait() for _ in range(n)]
            return sorted((x for x in taken if x is not None), key=lambda x: x.seq)
        return []

    def _write_pair(self, a: tuple[list[_Item], str], b: tuple[list[_Item], str]) -> bool:
        """Write two staged groups' data at once (b's on a second connection), then their
        chain rows in order (_chain_in_order). False, writing nothing, when there is no
        second connection: the caller writes them one after the other."""
        (run_a, token_a), (run_b, token_b) = a, b
        t0 = time.perf_counter()
        try:
            other = self._extra_client(0)
        except Exception as exc:
            log.warning("second store connection failed, writing in turn: %s", exc)
            return False
        errors: dict[str, BaseException | None] = {}

        def data_b() -> None:
            errors["b"] = self._staged_data(other, run_b, token_b)

        t = threading.Thread(target=data_b, name="ingest-writer-b", daemon=True)
        t.start()
        errors["a"] = self._staged_data(self.client, run_a, token_a)
        t.join()
        ok = self._chain_in_order(
            [(run_a, token_a, errors.get("a")), (run_b, token_b, errors.get("b"))]
        )
        self.timings["store_s"] += time.perf_counter() - t0
        with self._lock:
            self.stats["pair_writes" if ok else "pair_fallbacks"] += 1
        return True

    def _staged_data(self, client: Client, run: list[_Item], token: str) -> BaseException | None:
        """write_staged_data of a run on `client`; the exception instead of raising it."""
        try:
            write_staged_data(client, self.database, _members(run), token=token)
        except BaseException as exc:
            return exc
        return None

    def _chain_in_order(self, parts: list[tuple[list[_Item], str, BaseException | None]]) -> bool:
        """After data written at once on two connections: each run's chain rows, in order. A
        run whose data write failed (the exception given) or whose chain rows fail is written
        again the usual way (_write: retries; its token makes the data that did get in count
        once), before the next run's chain rows. True when nothing had to be written again.
        Each run's spool records are committed after its chain rows."""
        clean = True
        for run, token, error in parts:
            try:
                if error is not None:
                    raise error
                res = self._chain_rows(run, token)
            except Exception as exc:
                log.warning("write of %d request(s) failed, writing again: %s", len(run), exc)
                clean = False
                self._write(run, token, retry=True)
                continue
            self._stored(run, res)
        return clean

    def _chain_rows(self, run: list[_Item], token: str) -> list[BatchResult]:
        """The ingest_batches rows of a staged run whose data are stored, from the chain head."""
        return write_staged_chain(
            self.client, self.database, _members(run), tenant=run[0].decoded.tenant,
            token=token, prev_chain=self._chain, source=self.source,
        )  # fmt: skip

    def _extra_client(self, i: int) -> Client:
        """The i-th extra connection (0 or 1), opened now if it is not yet."""
        with self._extra_lock:
            while len(self._extra) <= i:
                assert self.stager is not None
                self._extra.append(self.stager.new_client())
            return self._extra[i]

    def _open_extra_clients(self) -> None:
        """Open the extra connections ahead of need: an embedded connection takes ~40-50 ms to
        open, which was spent at the end of a burst, between its last acknowledgement and its
        spans being stored (a write would open it otherwise: see _extra_client)."""
        assert self.stager is not None
        try:
            for i in range(_EXTRA_CLIENTS):
                with self._extra_lock:  # stop() closes them under this lock, after _stopping
                    if self._stopping.is_set():
                        return
                    if len(self._extra) <= i:
                        self._extra.append(self.stager.new_client())
        except Exception as exc:  # the write that needs one tries again, or writes in turn
            log.warning("could not open a second store connection: %s", exc)

    def _write(self, run: list[_Item], token: str, *, retry: bool) -> None:
        delay = 0.05
        refused = 0
        while True:
            try:
                self._write_once(run, token)
                self._store_error = None
                return
            except Exception as exc:  # the store failed: keep the records, retry, never drop
                self._store_error = str(exc)[:500]
                with self._lock:
                    self.stats["store_errors"] += 1
                log.warning(
                    "store write failed (%d request(s), token %s), retrying: %s",
                    len(run),
                    token,
                    exc,
                )
                if _is_refusal(exc):
                    refused += 1
                    if refused >= self._max_refusals and all(x.body is not None for x in run):
                        # The store is up but refuses these every time: park them on disk
                        # (dead/), count them, and let the rest flow. Never silently dropped.
                        for x in run:
                            self._park(x, exc)
                        if self.stager is not None:
                            self.stager.release([x.stage for x in run if x.stage])
                        self._store_error = None
                        return
                if not retry or self._stopping.is_set() or self._draining.is_set():
                    raise
                self._draining.wait(delay)
                delay = min(delay * 2, 2.0)

    def _park(self, item: _Item, exc: Exception) -> None:
        dead = self.spool.dir / "dead"
        dead.mkdir(exist_ok=True)
        meta = {
            "batch": item.batch_id,
            "seq": item.seq,
            "tenant": item.decoded.tenant,
            "fmt": item.fmt,
            "received_at_ms": item.received_at_ms,
            "error": str(exc)[:2000],
        }
        (dead / f"{item.batch_id}.body").write_bytes(item.body or b"")
        (dead / f"{item.batch_id}.json").write_text(json.dumps(meta, indent=1))
        log.error(
            "batch %s refused %d times by the store; parked in %s: %s",
            item.batch_id,
            self._max_refusals,
            dead,
            exc,
        )
        with self._lock:
            self.stats["parked_batches"] += 1
        self.spool.commit(item.seq)

    def _write_once(self, run: list[_Item], token: str) -> None:
        t0 = time.perf_counter()
        if run[0].stage is not None:
            members = _members(run)
            if len(members) != len(run):  # _write_items unstages mixed runs; never drop one
                raise RuntimeError("a staged write group holds a request that is not staged")
            results = write_staged_group(
                self.client,
                self.database,
                members,
                tenant=run[0].decoded.tenant,
                token=token,
                prev_chain=self._chain,
                source=self.source,
            )
        else:
            results = write_group(
                self.client,
                self.database,
                [Member(x.batch_id, x.decoded, x.received_at_ms) for x in run],
                token=token,
                prev_chain=self._chain,
                source=self.source,
            )
        took = time.perf_counter() - t0
        self.timings["store_s"] += took
        self.write_latency.observe(took)
        self._stored(run, results)

    def _stored(self, run: list[_Item], results: list[BatchResult]) -> None:
        """Bookkeeping after a group's data and chain rows are in the store."""
        for res in results:
            self._known[res.ingest_batch] = res.chain_hash
            self._chain = res.chain_hash
            with self._lock:
                self.stats["stored"] += res.stored
                self.stats["rejected"] += res.rejected
                self.stats["batches"] += 1
        while len(self._known) > _KNOWN_BATCHES:
            self._known.popitem(last=False)
        with self._lock:
            self.stats["writes"] += 1
        if self.stager is not None and run[0].stage is not None:
            self.stager.release([x.stage for x in run if x.stage])
        for x in run:
            self.spool.commit(x.seq)
