"""Two or more groups written at once: a chDB-decoded group's data on the writer's client
while the requests acknowledged meanwhile are taken off the queue and their data written
on the extra connections, chain rows after, in order. The decisions are ingest._plan's
(pick_followers, follower_parts); this is their thread and condition part.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ingest._arrivals import Arrivals
from ingest._plan import follower_parts, pick_followers
from ingest._purge import anon_rss_bytes

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._backend import Group, Pending
    from ingest._execute import Executor

__all__ = ["Overlap"]


class Overlap:
    """A chDB-decoded group written while the requests acknowledged meanwhile wait for no
    whole write: should some arrive and then none for Arrivals.QUIET_S (the end of a
    burst), they are taken off the queue and their data written at once on the extra
    connections (ingest._plan.follower_parts), chain rows after the group's."""

    def __init__(
        self,
        executor: Executor,
        q: queue.Queue[Pending | None],
        arrivals: Arrivals,
        clients: Callable[[int], Client],
        *,
        rss: Callable[[], int] = anon_rss_bytes,
    ) -> None:
        self._w, self._q, self._arrivals, self._clients, self._rss = (
            executor, q, arrivals, clients, rss,
        )  # fmt: skip
        self._taken: list[Pending] = []

    def take_taken(self) -> list[Pending]:
        """Requests taken off the queue since the last call (the caller marks them done)."""
        taken, self._taken = self._taken, []
        return taken

    def write(self, group: Group, *, max_rss: int) -> None:
        """Write `group`; with followers when its requests are staged. `max_rss` (bytes,
        0: no limit): at or above it, followers stay queued for the next write."""
        w = self._w
        if w.stager is None or any(x.stage is None for x in group.members):
            w.write(group)
            return
        done = threading.Event()
        errors: dict[str, BaseException | None] = {}

        def data_a() -> None:
            try:
                errors["a"] = w.data(w.client, group)
            finally:
                done.set()
                self._arrivals.notify()

        t0 = time.perf_counter()
        t = threading.Thread(target=data_a, name="ingest-writer-a", daemon=True)
        t.start()
        more = self._followers(done, group, max_rss)
        parts: list[tuple[Group, BaseException | None]] = []
        if more:
            self._taken += more
            w.count("overlapped_writes")
            by_seq = {x.seq: x for x in more}
            halves = follower_parts([x.request for x in more])
            groups = [[by_seq[r.seq] for r in h] for h in halves]
            parts = w.data_at_once([w.group(g) for g in groups], self._clients)
        t.join()
        w.chain_in_order([(group, errors.get("a")), *parts])
        w.timings["store_s"] += time.perf_counter() - t0

    def _followers(self, done: threading.Event, group: Group, max_rss: int) -> list[Pending]:
        """While `done` is unset: once no request is on its way for Arrivals.QUIET_S, the
        followers at the head of the queue (ingest._plan.pick_followers), taken off
        it; [] if none before `done`, or at `max_rss`."""
        reqs = [x.request for x in group.members]
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
