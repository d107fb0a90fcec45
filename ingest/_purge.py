"""When to hand the embedded engine's freed pages back to the OS (SYSTEM JEMALLOC PURGE).

jemalloc keeps freed pages for seconds; after writes they are mostly the writes' blocks.
Not after every write: the next write faults the pages back in (measured: purging after
each write cost ~18% of serve's CPU per span, 2 senders). So: after a write when no request
is on its way and the last purge is EVERY_S old; or, under load (`under_load`), once serve's
anonymous memory passed ABOVE_BYTES, at most every MIN_GAP_S — also before a request is decoded, since a
decode and a write at once are serve's memory peak.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["ABOVE_BYTES", "EVERY_S", "MIN_GAP_S", "Purger", "anon_rss_bytes"]

EVERY_S = 5.0  # seconds between purges while quiet
MIN_GAP_S = 0.25  # seconds between purges under load
#: anonymous resident memory (bytes) from which purges happen under load (the engine
#: library's ~200 MiB of file-backed pages are not counted: they are not what a purge frees)
ABOVE_BYTES = 192 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory in bytes: its resident set without the pages
    backed by files (the engine library's code and data) or shared memory, which the kernel
    can drop or share and a memory limit does not see the same way (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class Purger:
    """Decides and runs purges. Thread-safe. Keyword-only injection points: `rss` (bytes),
    `monotonic` (seconds), and the three thresholds (module constants by default)."""

    def __init__(
        self,
        *,
        enabled: bool,
        under_load: bool = True,
        every_s: float = EVERY_S,
        min_gap_s: float = MIN_GAP_S,
        above_bytes: int = ABOVE_BYTES,
        rss: Callable[[], int] = anon_rss_bytes,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.under_load = under_load
        self._every_s, self._min_gap_s, self._above = every_s, min_gap_s, above_bytes
        self._rss, self._now = rss, monotonic
        self._lock = threading.Lock()
        self._last = monotonic()
        self.purges = 0  # purges run (count)

    def due_after_write(self, *, quiet: bool) -> bool:
        """Take the next purge after a write? `quiet`: no request on its way, none queued.
        True claims it (the caller purges)."""
        if not self.enabled:
            return False
        now = self._now()
        with self._lock:
            since = now - self._last
            loaded = self.under_load and since >= self._min_gap_s and self._rss() >= self._above
            if not (since >= self._every_s and quiet) and not loaded:
                return False
            self._last = now
            return True

    def due_before_decode(self) -> bool:
        """Take a purge before a decode? Only under load, past the RSS threshold."""
        if not (self.enabled and self.under_load):
            return False
        now = self._now()
        with self._lock:
            if now - self._last < self._min_gap_s or self._rss() < self._above:
                return False
            self._last = now
            return True

    def purge(self, client: Client) -> None:
        """Run one purge on `client`; a failing one is ignored (it only frees memory)."""
        self.purges += 1
        with contextlib.suppress(Exception):
            client.command("SYSTEM JEMALLOC PURGE")
