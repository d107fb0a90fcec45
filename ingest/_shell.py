"""The writer's view of what is arriving, and writes that take followers: the thread and
condition parts of the write side (the decisions are ingest._planner's).

Arrivals counts requests inside Ingestor.submit and requests announced by their headers
(Ingestor.receiving), and wakes waiters on every change: the writer waits on it for "no
request started arriving for QUIET_S" instead of polling.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ingest._planner import follower_parts, pick_followers
from ingest._purge import anon_rss_bytes
from ingest._store_writer import Pending

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._writes import Writes

__all__ = ["Arrivals", "Overlap"]

_SAFETY_S = 1.0  # longest wait without a wake-up (every change notifies; this only bounds)


class Arrivals:
    """Requests on their way to the writer, with a condition notified on every change."""

    #: a write is "the end of a burst" when no request starts arriving for this long (s)
    QUIET_S = 0.01

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0  # requests inside submit(): decoding, spooling or queueing
        self._announced = 0  # requests whose headers arrived (chDB-sized protobuf bodies)
        self._started = 0  # arrivals so far (count)
        self._changes = 0  # notifications so far (count)

    def _bump(self, inside: int = 0, announced: int = 0) -> None:
        with self._cond:
            self._inside += inside
            self._announced += announced
            self._started += inside > 0 or announced > 0
            self._changes += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Around one submit()."""
        self._bump(inside=1)
        try:
            yield
        finally:
            self._bump(inside=-1)

    @contextlib.contextmanager
    def announced(self) -> Iterator[None]:
        """Around reading and submitting one announced request."""
        self._bump(announced=1)
        try:
            yield
        finally:
            self._bump(announced=-1)

    def notify(self) -> None:
        """Wake the waiters (something else they wait for happened: a write ended)."""
        self._bump()

    def on_the_way(self) -> bool:
        """A request is inside submit() or announced."""
        return bool(self._inside or self._announced)

    def quiet(self, seconds: float, *, cancel: threading.Event | None = None) -> bool:
        """True when no request is on its way now and none starts arriving for `seconds`;
        False at once when `cancel` is set (set it, then notify())."""
        with self._cond:
            if self._inside or self._announced:
                return False
            start = self._started

            def woken() -> bool:
                return self._started != start or (cancel is not None and cancel.is_set())

            if self._cond.wait_for(woken, seconds):
                return False
            return not (self._inside or self._announced)

    def wait_settled(self, cancel: threading.Event) -> None:
        """Until no request is on its way, or `cancel` is set (set it, then notify())."""
        with self._cond:
            self._cond.wait_for(
                lambda: cancel.is_set() or not (self._inside or self._announced), _SAFETY_S
            )

    def wait_change(self, cancel: threading.Event) -> None:
        """Until the next change (an arrival starts or ends), or `cancel` is set."""
        with self._cond:
            start = self._changes
            self._cond.wait_for(lambda: cancel.is_set() or self._changes != start, _SAFETY_S)


class Overlap:
    """A chDB-decoded group written while the requests acknowledged meanwhile wait for no
    whole write: should some arrive and then none for Arrivals.QUIET_S (the end of a
    burst), they are taken off the queue and their data written at once on the extra
    connections (ingest._planner.follower_parts), chain rows after the group's."""

    def __init__(
        self,
        writes: Writes,
        q: queue.Queue[Pending | None],
        arrivals: Arrivals,
        clients: Callable[[int], Client],
        *,
        rss: Callable[[], int] = anon_rss_bytes,
    ) -> None:
        self._w, self._q, self._arrivals, self._clients, self._rss = (
            writes, q, arrivals, clients, rss,
        )  # fmt: skip
        self._taken: list[Pending] = []

    def take_taken(self) -> list[Pending]:
        """Requests taken off the queue since the last call (the caller marks them done)."""
        taken, self._taken = self._taken, []
        return taken

    def write(self, group: list[Pending], token: str, *, max_rss: int) -> None:
        """Write `group`; with followers when its requests are staged. `max_rss` (bytes,
        0: no limit): at or above it, followers stay queued for the next write."""
        w = self._w
        if w.stager is None or any(x.stage is None for x in group):
            w.write(group, token)
            return
        done = threading.Event()
        errors: dict[str, BaseException | None] = {}

        def data_a() -> None:
            try:
                errors["a"] = w.data(w.client, group, token)
            finally:
                done.set()
                self._arrivals.notify()

        t0 = time.perf_counter()
        t = threading.Thread(target=data_a, name="ingest-writer-a", daemon=True)
        t.start()
        more = self._followers(done, group, max_rss)
        parts: list[tuple[list[Pending], str, BaseException | None]] = []
        if more:
            self._taken += more
            w.count("overlapped_writes")
            by_seq = {x.seq: x for x in more}
            halves = follower_parts([x.request for x in more])
            groups = [[by_seq[r.seq] for r in h] for h in halves]
            parts = w.data_at_once([(g, w.token(g)) for g in groups], self._clients)
        t.join()
        w.chain_in_order([(group, token, errors.get("a")), *parts])
        w.timings["store_s"] += time.perf_counter() - t0

    def _followers(
        self, done: threading.Event, group: list[Pending], max_rss: int
    ) -> list[Pending]:
        """While `done` is unset: once no request is on its way for Arrivals.QUIET_S, the
        followers at the head of the queue (ingest._planner.pick_followers), taken off
        it; [] if none before `done`, or at `max_rss`."""
        reqs = [x.request for x in group]
        a = self._arrivals
        while not done.is_set():
            a.wait_settled(done)
            if done.is_set() or not a.quiet(Arrivals.QUIET_S, cancel=done) or done.is_set():
                continue
            with self._q.mutex:  # the writer is the only consumer: the head stays
                n = pick_followers(
                    (x.request if x is not None else None for x in self._q.queue),
                    reqs,
                    self._w.known,
                )
            if not n:
                a.wait_change(done)
                continue
            if max_rss and self._rss() >= max_rss:
                self._w.count("overlaps_skipped_for_memory")
                return []
            taken = [self._q.get_nowait() for _ in range(n)]
            return sorted((x for x in taken if x is not None), key=lambda x: x.seq)
        return []
