"""The ingest pipeline behind serve: decode -> spool (durable) -> writer thread -> store.

`Ingestor.submit` returns only after the request is on disk in the spool, so a 200 never
precedes durability. One writer thread stores spool records in order, one ingest batch per
request, its id (and dedup token) derived from tenant and body: a retried request or a
replayed spool record maps to the same batch and is stored once. A failing store is retried
with backoff; while it fails, submit refuses new work (503) instead of accepting it blindly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingest._decode import DecodedBatch, decode_request
from ingest._spool import Spool
from ingest._writer import last_chain_hash, make_token, write_batch

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["Ingestor", "StoreUnavailable"]

log = logging.getLogger("handoffs.ingest")
_KNOWN_BATCHES = 50_000  # batch ids remembered to keep a retried request off the chain
_MAX_QUEUED = 2  # decoded requests held in memory for the writer


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


_MAX_REFUSALS = 20  # the store answered with an error this many times for one batch: park it


def _is_refusal(exc: Exception) -> bool:
    """The store answered and refused (a ClickHouse error), as opposed to being unreachable."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    return isinstance(exc, DatabaseError) and not isinstance(exc, OperationalError)


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
    ) -> None:
        self.client = client
        self.database = database
        self.spool = spool
        self.source = source
        self._clock = clock
        self._max_refusals = max_refusals
        # Bounded: decoded batches waiting for the writer cost memory; when it is full, a
        # request (already durable in the spool) waits here, which slows senders down.
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=_MAX_QUEUED)
        self._known: OrderedDict[str, str] = OrderedDict()
        self._chain = ""
        self._store_error: str | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.stats: dict[str, int] = {
            "requests": 0,
            "spans": 0,
            "stored": 0,
            "rejected": 0,
            "batches": 0,
            "duplicate_batches": 0,
            "store_errors": 0,
            "parked_batches": 0,
        }
        #: cumulative wall seconds per stage (threads overlap): for operators and benchmarks
        self.timings: dict[str, float] = {
            "decode_s": 0.0,
            "spool_s": 0.0,
            "queue_wait_s": 0.0,
            "store_s": 0.0,
        }
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Load the chain head, replay the spool left by a crash, start the writer.

        Returns the number of spool records replayed.
        """
        self._load_chain()
        replayed = 0
        for rec in self.spool.uncommitted():
            h = rec.header
            decoded = decode_request(rec.body, h["fmt"], tenant=h["tenant"])
            item = _Item(rec.seq, h["batch"], int(h["received_at_ms"]), decoded, rec.body, h["fmt"])
            self._write(item, retry=True)
            replayed += 1
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()
        return replayed

    def stop(self, *, timeout: float = 60.0) -> bool:
        """Store everything queued, then stop the writer. True when drained within timeout (s)."""
        if self._thread is None:
            return True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        drained = not self._thread.is_alive()
        self._stopping.set()
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

    def submit(self, body: bytes, fmt: str, *, tenant: str) -> DecodedBatch:
        """Decode, validate and durably spool one request; return the decoded batch.

        Raises DecodeError (bad body), SpoolFull or StoreUnavailable (answer 503).
        Empty requests are acknowledged without touching the spool.
        """
        t0 = time.perf_counter()
        decoded = decode_request(body, fmt, tenant=tenant)
        t1 = time.perf_counter()
        with self._lock:
            self.stats["requests"] += 1
            self.stats["spans"] += decoded.spans
            self.timings["decode_s"] += t1 - t0
        if decoded.spans == 0:
            return decoded
        if self._store_error is not None:
            raise StoreUnavailable(f"store is failing: {self._store_error}")
        batch_id = make_token(tenant, hashlib.sha256(body).hexdigest())
        received = int(self._clock() * 1000)
        header = {"tenant": tenant, "fmt": fmt, "batch": batch_id, "received_at_ms": received}
        seq = self.spool.append(header, body)  # durable when it returns; may raise SpoolFull
        t2 = time.perf_counter()
        self._queue.put(_Item(seq, batch_id, received, decoded, body, fmt))
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
            **self.stats,
            **{k: round(v, 3) for k, v in self.timings.items()},
        }

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once every accepted request is stored (polls; for tests and drains)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------ writer

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(item, retry=True)
            except Exception as exc:  # only when stopping: the record stays spooled for replay
                log.error(
                    "writer stopped with batch %s unstored (kept in the spool): %s",
                    item and item.batch_id,
                    exc,
                )
                return
            finally:
                self._queue.task_done()

    def _write(self, item: _Item, *, retry: bool) -> None:
        delay = 0.05
        refused = 0
        while True:
            try:
                self._write_once(item)
                self._store_error = None
                return
            except Exception as exc:  # the store failed: keep the record, retry, never drop
                self._store_error = str(exc)[:500]
                with self._lock:
                    self.stats["store_errors"] += 1
                log.warning("store write failed (batch %s), retrying: %s", item.batch_id, exc)
                if _is_refusal(exc):
                    refused += 1
                    if refused >= self._max_refusals and item.body is not None:
                        # The store is up but refuses this batch every time: park it on disk
                        # (dead/), count it, and let the rest flow. Never silently dropped.
                        self._park(item, exc)
                        self._store_error = None
                        return
                if not retry or self._stopping.is_set():
                    raise
                time.sleep(delay)
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
            _MAX_REFUSALS,
            dead,
            exc,
        )
        with self._lock:
            self.stats["parked_batches"] += 1
        self.spool.commit(item.seq)

    def _write_once(self, item: _Item) -> None:
        if item.batch_id in self._known:
            # Already stored completely (ingest_batches is written last): a retried request.
            with self._lock:
                self.stats["duplicate_batches"] += 1
            self.spool.commit(item.seq)
            return
        t0 = time.perf_counter()
        res = write_batch(
            self.client,
            self.database,
            [item.decoded],
            batch_id=item.batch_id,
            prev_chain=self._chain,
            received_at_ms=item.received_at_ms,
            source=self.source,
        )
        self.timings["store_s"] += time.perf_counter() - t0
        self._chain = res.chain_hash
        self._known[item.batch_id] = res.chain_hash
        while len(self._known) > _KNOWN_BATCHES:
            self._known.popitem(last=False)
        with self._lock:
            self.stats["stored"] += res.stored
            self.stats["rejected"] += res.rejected
            self.stats["batches"] += 1
        self.spool.commit(item.seq)
