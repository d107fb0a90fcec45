"""The ingest pipeline behind serve: decode -> spool (durable) -> writer thread -> store.

`Ingestor.submit` returns only after the request is on disk in the spool, so a 200 never
precedes durability. Each request is one ingest batch whose id derives from tenant and body,
so a retried request or a replayed record maps to the same batch and is stored once (known
batch ids are skipped). One writer thread (ingest._writer_thread) takes what is queued and
writes it as the pure planner (ingest._plan) says: groups of the requests of one decoder,
whatever their tenants (every row carries its tenant; one insert per table), two halves at
once, requests arriving during a write alongside it. A group's member list is logged
durably in the spool before the write, so a replay after a crash rebuilds the same group
and its dedup token. A failing store is retried with backoff (ingest._execute); while it
fails, submit refuses new work (503) instead of accepting it blindly. Which failures park a
group instead: ingest._refusals and ingest._plan.on_failure.

Here: the request path (decode, spool, queue), start (chain head, replay) and stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from foundation.ledger_instances import source_with
from foundation.store import StoreUnavailable  # the store failing: answer 503
from ingest._arrivals import Arrivals
from ingest._backend import Backends, Pending, WriteBackend
from ingest._decode import PROTOBUF, DecodedBatch, decode_request
from ingest._execute import KNOWN_BATCHES, Executor
from ingest._inserts import last_chain_hash, make_token
from ingest._plan import use_chdb_decoder
from ingest._purge import Purger, anon_rss_bytes
from ingest._spool import Spool
from ingest._telemetry import LatencyHistogram
from ingest._writer_thread import WriterThread

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest.chdb import Stager

__all__ = ["OVERLAP_MAX_RSS", "SQL_JOIN_MIN_BYTES", "SQL_MIN_BYTES", "Ingestor", "StoreUnavailable"]

#: requests acknowledged during a write are written at once with it (Overlap) only while
#: serve's anonymous memory (bytes, purge.anon_rss_bytes) is below this: three writes at
#: once hold ~20-45 MB more than two,
#: and the last writes of a burst are serve's memory peak; above it they go in right after
#: the running write (two halves at once)
OVERLAP_MAX_RSS = 240 << 20
#: Smallest protobuf body (bytes) chDB always decodes (ingest.chdb); smaller ones go
#: through Python, whose cost per request is lower for a request alone: chDB's decoding
#: queries run for the life of serve, but each round of requests still costs ~6 ms of
#: fixed work (one round trip, one INSERT staging its blocks; the requests queued together
#: share it). A sender waiting for each answer was faster on Python at 512 spans (~180 KB)
#: and on chDB at 1,000 (~350 KB): bench/RESULTS.md, the decoders' table.
#: (OTel SDK batches of 512 spans are ~180 KB; a Collector's 8192-span batches ~3 MB.)
SQL_MIN_BYTES = 256 * 1024
#: Smallest protobuf body (bytes) announced while it is received: when two or more
#: announced requests are in flight at once, chDB decodes them (and any smaller body that
#: comes meanwhile) in one round and one write, cheaper than Python decoding each under
#: the GIL (ingest._plan.use_chdb_decoder).
SQL_JOIN_MIN_BYTES = 64 * 1024
_MAX_REFUSALS = 20  # the store refused one group's data this many times: park it


class Ingestor:
    """Owns the spool and the writer thread (ingest._writer_thread.WriterThread).
    Keyword-only injection points: `clock` (epoch seconds), `backend` (ingest._backend.
    WriteBackend, the store side of a write, built on `client` and `database`; default
    Backends writing source_with(`source`, `instance`): a given one writes the source it
    was built with), `purger` (ingest._purge.Purger; default from purge_memory /
    purge_under_load), `rss` (this process's anonymous resident memory in bytes, checked
    against overlap_max_rss)."""

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
        backend: WriteBackend | None = None,
        purger: Purger | None = None,
        rss: Callable[[], int] = anon_rss_bytes,
        instance: str = "",
    ) -> None:
        self.client = client
        #: the serve instance whose ledger log this writes (foundation.ledger_instances): its
        #: batches carry it in `source` and chain from GENESIS on their own
        self.instance = instance
        #: embedded store: RSS (bytes) from which requests acknowledged during a write are
        #: no longer written at once with it (serve passes OVERLAP_MAX_RSS; 0: no limit)
        self.overlap_max_rss = overlap_max_rss
        #: embedded store: hand the engine's freed pages back to the OS (ingest._purge);
        #: purge_under_load=False when the allocator does so promptly by itself
        self.purger = purger or Purger(enabled=purge_memory, under_load=purge_under_load)
        self.stager = stager
        self.sql_min_bytes = sql_min_bytes
        #: whether the request this thread receives now was announced (receiving)
        self._announced = threading.local()
        self.database = database
        self.spool = spool
        self.source = source
        self._clock = clock
        #: stop() was called: a write that fails now is not retried (its records stay in the
        #: spool for the next start), so a stop never waits on a failing store
        self._draining = threading.Event()
        self.stats: dict[str, int] = {
            "requests": 0,
            "spans": 0,
            "stored": 0,
            "rejected": 0,
            "batches": 0,
            "duplicate_batches": 0,
            "store_errors": 0,
            "parked_batches": 0,
            "split_groups": 0,  # refused groups written again request by request
            "writes": 0,
            "pair_writes": 0,  # groups written as two halves at once
            "pair_fallbacks": 0,  # ... that failed and were written the usual way
            # requests stored alongside a write that was running when they arrived
            "overlapped_writes": 0,
            "overlaps_skipped_for_memory": 0,
        }
        #: cumulative wall seconds per stage (threads overlap): for operators and benchmarks
        self.timings: dict[str, float] = {
            "decode_s": 0.0,
            "spool_s": 0.0,
            "queue_wait_s": 0.0,
            "store_s": 0.0,
        }
        self._lock = threading.Lock()
        self._arrivals = Arrivals()
        backend = backend or Backends(client, database, source=source_with(source, instance))
        self._executor = Executor(
            client, database, spool, backend=backend, stager=stager,
            max_refusals=max_refusals, stop_retrying=self._draining,
            stats=self.stats, timings=self.timings, lock=self._lock,
        )  # fmt: skip
        self._writer = WriterThread(
            client, self._executor, self._arrivals, stager=stager, purger=self.purger,
            overlap_max_rss=overlap_max_rss, rss=rss,
        )  # fmt: skip
        if stager is not None:
            stager.before_decode = self._purge_if_big

    @property
    def write_latency(self) -> LatencyHistogram:
        """Duration of each store write, for /metrics (handoffs_store_write_duration_seconds)."""
        return self._executor.write_latency

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Load the chain head, replay the spool left by a crash, start the writer.

        Returns the number of spool records replayed.
        """
        self._load_chain()
        if self.stager is not None:
            self.stager.setup()
            self._writer.connect_ahead()
        groups = self.spool.groups()
        present = {rec.seq for rec in self.spool.uncommitted()}
        replayed = 0
        waiting: dict[tuple[int, ...], list[Pending]] = {}
        for rec in self.spool.uncommitted():
            h = rec.header
            item = self._prepare(
                rec.body, h["fmt"], h["tenant"], h["batch"], int(h["received_at_ms"]), rec.seq
            )
            replayed += 1
            group = groups.get(rec.seq)
            if group is None:
                self._writer.write_round([item], replay=True)
                continue
            # Rebuild the logged group exactly (same members, same token) before writing it.
            members = waiting.setdefault(group, [])
            members.append(item)
            if len(members) == len([q for q in group if q in present]):
                self._writer.write_round(waiting.pop(group), replay=True, regroup=True)
        for members in waiting.values():  # cannot happen unless the log and spool disagree
            self._writer.write_round(members, replay=True, regroup=True)
        self._writer.start()
        return replayed

    def stop(self, *, timeout: float = 60.0) -> bool:
        """Store everything queued, then stop the writer. True when drained within timeout (s).

        A write that fails once stop() was called is not retried: what it held stays in the
        spool and is replayed at the next start (False is returned), so a store that cannot
        take writes (disk below the free-space threshold, unreachable) never holds a stop.
        """
        if not self._writer.started:
            return True
        self._draining.set()
        return self._writer.stop(timeout)

    def _load_chain(self) -> None:
        self._executor.chain = last_chain_hash(self.client, self.database, self.instance)
        rows = self.client.query(
            f"SELECT ingest_batch, chain_hash FROM {self.database}.ingest_batches "
            f"ORDER BY received_at DESC, ingest_batch DESC LIMIT {KNOWN_BATCHES}"
        ).result_rows
        for bid, ch in reversed(rows):
            self._executor.known[bid] = ch

    # ------------------------------------------------------------ request path

    def _prepare(
        self, body: bytes, fmt: str, tenant: str, batch_id: str, received: int, seq: int = -1
    ) -> Pending:
        """Decode one request: chDB stages it when it can (ingest.chdb), else ingest._decode.

        Both give the same stored rows; the Python decoder also gives the reject messages
        and raises DecodeError for a bad body.
        """
        if (
            self.stager is not None
            and fmt == PROTOBUF
            and use_chdb_decoder(
                len(body),
                min_bytes=self.sql_min_bytes,
                others=self.stager.announced() - getattr(self._announced, "on", 0),
            )
        ):
            staged = self.stager.stage(
                body, batch_id=batch_id, received_at_ms=received, tenant=tenant
            )
            if staged is not None:
                decoded = DecodedBatch(tenant=tenant, spans=staged.spans)
                return Pending(seq, batch_id, received, decoded, body, fmt, staged)
        decoded = decode_request(body, fmt, tenant=tenant)
        return Pending(seq, batch_id, received, decoded, body, fmt)

    @contextlib.contextmanager
    def receiving(self, fmt: str, nbytes: int) -> Iterator[None]:
        """Around reading and submitting one request (the HTTP and gRPC handlers, from its
        size): a protobuf body of SQL_JOIN_MIN_BYTES or more is announced, so the writer waits
        briefly for this request before a write (ingest._plan.next_take), and requests in
        flight together go to chDB together (ingest._plan.use_chdb_decoder)."""
        join_min = min(self.sql_min_bytes, SQL_JOIN_MIN_BYTES)
        if self.stager is not None and fmt == PROTOBUF and nbytes >= join_min:
            self._announced.on = 1
            try:
                with self.stager.incoming(), self._arrivals.announced():
                    yield
            finally:
                self._announced.on = 0
        else:
            yield

    def submit(self, body: bytes, fmt: str, *, tenant: str) -> DecodedBatch:
        """Decode, validate and durably spool one request; return the decoded batch.

        Raises DecodeError (bad body), SpoolFull or StoreUnavailable (answer 503).
        Empty requests are acknowledged without touching the spool.
        """
        t0 = time.perf_counter()
        with self._arrivals.inside():  # the writer may wait for this one
            return self._submit(body, fmt, tenant=tenant, t0=t0)

    def _submit(self, body: bytes, fmt: str, *, tenant: str, t0: float) -> DecodedBatch:
        # a named instance's batch ids are its own: the same request sent to two serves of one
        # store is a batch of each log (stored twice, each copy proven), never one serve's
        # dedup token swallowing the other's chain row
        parts = (self.instance,) if self.instance else ()
        batch_id = make_token(tenant, hashlib.sha256(body).hexdigest(), *parts)
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
        if self._executor.store_error is not None:
            if item.stage is not None and self.stager is not None:
                self.stager.release([item.stage])
            raise StoreUnavailable(f"store is failing: {self._executor.store_error}")
        header = {"tenant": tenant, "fmt": fmt, "batch": batch_id, "received_at_ms": received}
        try:
            seq = self.spool.append(header, body)  # durable when it returns; may raise SpoolFull
        except BaseException:
            if item.stage is not None and self.stager is not None:
                self.stager.release([item.stage])
            raise
        t2 = time.perf_counter()
        self._writer.put(replace(item, seq=seq))
        with self._lock:
            self.timings["spool_s"] += t2 - t1
            self.timings["queue_wait_s"] += time.perf_counter() - t2
        return decoded

    def health(self) -> dict[str, Any]:
        error = self._executor.store_error
        return {
            "status": "ok" if error is None else "store_unavailable",
            "store_error": error,
            "queued": self._writer.queue.qsize(),
            "spool_backlog_bytes": self.spool.backlog_bytes,
            "spool_oldest_unstored_age_s": round(self.spool.oldest_pending_age_s, 3),
            "decoder": "sql+python" if self.stager is not None else "python",
            "sql_decoded": self.stager.staged if self.stager is not None else 0,
            "sql_declined": self.stager.fallbacks if self.stager is not None else 0,
            "sql_decode_queries": self.stager.queries if self.stager is not None else 0,
            "sql_decode_rounds": self.stager.rounds if self.stager is not None else 0,
            "sql_decode_timeouts": self.stager.timeouts if self.stager is not None else 0,
            **self.stats,
            **{k: round(v, 3) for k, v in self.timings.items()},
        }

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once every accepted request is stored, False if some still are not after
        `timeout` seconds (for tests, drains and `GET /health?wait_s=`). Woken by the
        writer's last task_done, not by polling: a caller waiting costs serve no CPU."""
        q = self._writer.queue
        with q.all_tasks_done:
            return q.all_tasks_done.wait_for(lambda: q.unfinished_tasks == 0, timeout)

    def _purge_if_big(self, client: Client) -> None:
        """Before a request is decoded (on the decoding thread, with its client): see
        ingest._purge (a decode and a write at once are serve's memory peak)."""
        if self.purger.due_before_decode():
            self.purger.purge(client)
