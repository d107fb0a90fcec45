"""The ingest-writer thread and the queue it empties: request threads put accepted requests
on the queue (waiting while MAX_QUEUED_SPANS decoded spans are held), the writer takes a
round off it, plans it (ingest._plan) and writes each group in its shape (one write,
two halves at once, or with followers: ingest._execute, ingest._overlap). It also keeps
the two extra store connections those writes use, opened ahead by the ingest-connect
thread and closed once the writer drained.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ingest._arrivals import Arrivals
from ingest._decode import decode_request
from ingest._overlap import Overlap
from ingest._plan import Shape, keep_lingering, next_take, plan_round, shape, split_in_two
from ingest._purge import anon_rss_bytes

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._backend import Pending
    from ingest._execute import Executor
    from ingest._purge import Purger
    from ingest.chdb import Stager

__all__ = ["MAX_QUEUED_SPANS", "WriterThread"]

log = logging.getLogger("handoffs.ingest")
MAX_QUEUED_SPANS = 40_000  # decoded / staged spans held for the writer; then put() waits
_EXTRA_CLIENTS = 2  # see WriterThread.connect_ahead


class WriterThread:
    """The queue's only consumer. Owns the queue, the room (decoded spans queued: request
    threads wait in put() past MAX_QUEUED_SPANS, the writer frees it after each round), the
    extra connections and their lock. Writes through `executor`, which owns the chain head;
    lingers and picks followers on `arrivals`; purges the engine through `purger` after a
    write. `overlap_max_rss` (bytes, 0: no limit) and `rss` as Ingestor's."""

    def __init__(
        self,
        client: Client,
        executor: Executor,
        arrivals: Arrivals,
        *,
        stager: Stager | None,
        purger: Purger,
        overlap_max_rss: int = 0,
        rss: Callable[[], int] = anon_rss_bytes,
    ) -> None:
        self._client, self._x, self._arrivals = client, executor, arrivals
        self._stager, self._purger, self._max_rss = stager, purger, overlap_max_rss
        self.queue: queue.Queue[Pending | None] = queue.Queue()
        # Decoded spans waiting for the writer cost memory: past MAX_QUEUED_SPANS a request
        # (already durable in the spool) waits for room, which slows senders down.
        self._room = threading.Condition()
        self._queued_spans = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # read by ingest-connect
        self._kept_in_spool = False  # the writer stopped with requests left for replay
        self._extra: list[Client] = []
        self._extra_lock = threading.Lock()
        self._overlap = Overlap(executor, self.queue, arrivals, self._extra_client, rss=rss)

    # ------------------------------------------------------------ request threads

    def put(self, item: Pending) -> None:
        """Queue `item` for the writer, once the spans already queued leave room for it."""
        with self._room:
            while self._queued_spans and self._queued_spans + item.decoded.spans > MAX_QUEUED_SPANS:
                self._room.wait(1.0)
            self._queued_spans += item.decoded.spans
        self.queue.put(item)

    # ------------------------------------------------------------ lifecycle

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the writer thread (after the spool's replay)."""
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Queue the stop marker and join the writer (`timeout` s). True when it drained
        everything queued; then the extra connections are closed."""
        assert self._thread is not None
        self.queue.put(None)
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

    def connect_ahead(self) -> None:
        """Open the extra connections on the ingest-connect thread, ahead of need: an
        embedded connection takes ~40-50 ms to open, which was spent at the end of a burst,
        between its last acknowledgement and its spans being stored (a write would open it
        otherwise: see _extra_client)."""
        threading.Thread(target=self._open_extra, name="ingest-connect", daemon=True).start()

    def _open_extra(self) -> None:
        assert self._stager is not None
        try:
            for i in range(_EXTRA_CLIENTS):
                with self._extra_lock:  # stop() closes them under this lock, after _stopping
                    if self._stopping.is_set():
                        return
                    if len(self._extra) <= i:
                        self._extra.append(self._stager.new_client())
        except Exception as exc:  # the write that needs one tries again, or writes in turn
            log.warning("could not open a second store connection: %s", exc)

    def _extra_client(self, i: int) -> Client:
        """The i-th extra connection (0 or 1), opened now if it is not yet."""
        with self._extra_lock:
            while len(self._extra) <= i:
                assert self._stager is not None
                self._extra.append(self._stager.new_client())
            return self._extra[i]

    # ------------------------------------------------------------ the writer

    def _collect(self) -> list[Pending | None]:
        """One round's requests off the queue (ingest._plan.next_take, keep_lingering)."""
        got: list[Pending | None] = [self.queue.get()]
        t0 = time.monotonic()
        while got[-1] is not None:
            reqs = [x.request for x in got if x is not None]
            wait = next_take(reqs, arriving=self._arrivals.on_the_way())
            if wait is None:
                break
            try:
                got.append(self.queue.get(timeout=wait) if wait else self.queue.get_nowait())
            except queue.Empty:
                lingered = time.monotonic() - t0
                if not keep_lingering(
                    reqs, arriving=self._arrivals.on_the_way(), lingered_s=lingered
                ):
                    break
        return got

    def _run(self) -> None:
        while True:
            got = self._collect()
            items = [x for x in got if x is not None]
            stop = len(items) != len(got)
            try:
                if items:
                    self.write_round(items)
                    quiet = not self._arrivals.on_the_way() and self.queue.empty()
                    if self._purger.due_after_write(quiet=quiet):
                        self._purger.purge(self._client)
            except Exception as exc:  # only when stopping: the records stay spooled for replay
                log.error("writer stopped, %d request(s) kept in the spool: %s", len(items), exc)
                self._kept_in_spool = True
                stop = True
            finally:
                # requests a write took from the queue meanwhile (Overlap) are done (stored,
                # or kept in the spool when stopping) with this round's
                taken = self._overlap.take_taken()
                got += taken
                items += taken
                with self._room:
                    self._queued_spans -= sum(x.decoded.spans for x in items)
                    self._room.notify_all()
                for _ in got:
                    self.queue.task_done()
            if stop:
                return

    def write_round(
        self, items: list[Pending], *, replay: bool = False, regroup: bool = False
    ) -> None:
        """Write one round of requests as ingest._plan.plan_round and shape say (`replay`:
        spool records at start; `regroup`: one logged group, rebuilt whole)."""
        x = self._x
        by_seq_id = {(it.seq, it.batch_id): it for it in items}
        plan = plan_round([it.request for it in items], x.known, regroup=regroup)
        for r in plan.duplicates:
            x.count("duplicate_batches")
            x.discard(by_seq_id[(r.seq, r.batch_id)])
        for i, reqs in enumerate(plan.groups):
            members = [by_seq_id[(r.seq, r.batch_id)] for r in reqs]
            for it in [it for it in members if it.batch_id in x.known]:  # stored earlier
                x.count("duplicate_batches")
                x.discard(it)
                members.remove(it)
            if not members:
                continue
            if len({it.stage is None for it in members}) > 1:  # a replayed group of both kinds
                members = [self._unstage(it) for it in members]
            how = shape(
                [it.request for it in members],
                last=i == len(plan.groups) - 1,
                arriving=self._arrivals.on_the_way(),
                paired=self._stager is not None,
                replay=replay,
            )
            if how is Shape.HALVES_IF_QUIET:
                if self._arrivals.quiet(Arrivals.QUIET_S):
                    first, _ = split_in_two([it.request for it in members])
                    self._write_pair(members[: len(first)], members[len(first) :])
                    continue
                how = Shape.OVERLAP if i == len(plan.groups) - 1 else Shape.WHOLE
            group = x.group(members, log_group=not replay)
            if replay:
                group = x.replay(group)
            if how is Shape.OVERLAP:
                self._overlap.write(group, max_rss=self._max_rss)
            else:
                x.write(group)
        for r in plan.later:
            x.count("duplicate_batches")
            x.discard(by_seq_id[(r.seq, r.batch_id)])

    def _write_pair(self, a: list[Pending], b: list[Pending]) -> None:
        """Two staged groups' data at once (b's on a second connection), then their chain
        rows in order; without a second connection, one after the other."""
        x = self._x
        planned = [x.group(a), x.group(b)]
        t0 = time.perf_counter()
        try:
            other = self._extra_client(0)
        except Exception as exc:
            log.warning("second store connection failed, writing in turn: %s", exc)
            for group in planned:
                x.write(group)
            return
        outcomes = x.data_at_once(planned, lambda i: self._client if i == 0 else other)
        ok = x.chain_in_order(outcomes)
        x.timings["store_s"] += time.perf_counter() - t0
        x.count("pair_writes" if ok else "pair_fallbacks")

    def _unstage(self, item: Pending) -> Pending:
        """The same request decoded by ingest._decode (same rows; for mixed replay groups)."""
        if item.stage is None or self._stager is None or item.body is None:
            return item
        self._stager.release([item.stage])
        decoded = decode_request(item.body, item.fmt, tenant=item.decoded.tenant)
        return replace(item, decoded=decoded, stage=None)
