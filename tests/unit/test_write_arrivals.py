"""The writer's view of requests on their way (ingest._arrivals.Arrivals): quiet, cancel."""

from __future__ import annotations

import threading
import time

from ingest._arrivals import Arrivals


def test_quiet_when_nothing_arrives_and_not_while_a_request_is_on_its_way():
    a = Arrivals()
    assert a.quiet(0.01) and not a.on_the_way()
    with a.inside():
        assert a.on_the_way() and not a.quiet(10.0)  # at once, no wait
    with a.announced():
        assert a.on_the_way() and not a.quiet(10.0)
    assert a.quiet(0.01)


def test_a_cancelled_wait_ends_at_once():
    a, done = Arrivals(), threading.Event()
    done.set()
    t0 = time.monotonic()
    assert not a.quiet(10.0, cancel=done)
    a.wait_change(done)
    with a.inside():
        a.wait_settled(done)
    assert time.monotonic() - t0 < 5.0


def test_waiters_wake_when_the_last_request_on_its_way_is_in():
    a, never = Arrivals(), threading.Event()
    entered, woke = threading.Event(), threading.Event()

    def waiter() -> None:
        entered.wait()
        a.wait_settled(never)
        woke.set()

    t = threading.Thread(target=waiter)
    with a.inside():
        t.start()
        entered.set()
        assert not woke.wait(0.05)  # still on its way
    assert woke.wait(5.0)
    t.join()
