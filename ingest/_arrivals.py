"""The writer's view of what is arriving: requests inside Ingestor.submit and requests
announced by their headers (Ingestor.receiving), with a condition notified on every change.
The writer waits on it for "no request started arriving for QUIET_S" instead of polling.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["Arrivals"]

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
    def _counted(self, inside: int, announced: int) -> Iterator[None]:
        self._bump(inside, announced)
        try:
            yield
        finally:
            self._bump(-inside, -announced)

    def inside(self) -> contextlib.AbstractContextManager[None]:
        """Around one submit()."""
        return self._counted(1, 0)

    def announced(self) -> contextlib.AbstractContextManager[None]:
        """Around reading and submitting one announced request."""
        return self._counted(0, 1)

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
