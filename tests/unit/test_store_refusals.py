"""Which store errors park a batch (about the data) and which are back-pressure; and when
the writer purges freed memory (ingest._purge, with an injected clock and RSS)."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    DataError,
    OperationalError,
    ProgrammingError,
)

from ingest._purge import Purger
from ingest._refusals import DATA_ERROR_CODES, error_code, is_about_data


@pytest.mark.parametrize("code", sorted(DATA_ERROR_CODES))
def test_errors_about_the_values_are_about_the_data(code):
    assert is_about_data(DatabaseError(f"Code: {code}. DB::Exception: x", code=code))


@pytest.mark.parametrize(
    ("code", "what"),
    [
        (164, "READONLY"),
        (497, "ACCESS_DENIED"),
        (76, "CANNOT_OPEN_FILE"),
        (1000, "POCO_EXCEPTION: Cannot open file"),
        (243, "NOT_ENOUGH_SPACE"),
        (241, "MEMORY_LIMIT_EXCEEDED"),
        (252, "TOO_MANY_PARTS"),
        (60, "UNKNOWN_TABLE"),
        (999_999, "a code nobody knows"),
    ],
)
def test_a_store_that_cannot_write_is_unavailable_not_refusing(code, what):
    assert not is_about_data(DatabaseError(f"Code: {code}. DB::Exception: {what}", code=code))


def test_no_code_or_no_database_error_is_unavailable():
    assert not is_about_data(DatabaseError("something went wrong"))
    assert not is_about_data(OperationalError("Code: 53. refused connection", code=53))
    assert not is_about_data(ConnectionError("connection reset by peer"))
    assert not is_about_data(OSError("Cannot open file"))


def test_a_value_the_client_cannot_encode_is_about_the_data():
    assert is_about_data(DataError("cannot encode"))
    assert not is_about_data(ProgrammingError("bad call"))


def test_the_code_comes_from_the_attribute_or_the_message():
    assert error_code(DatabaseError("x", code=53)) == 53
    assert error_code(RuntimeError("Code: 27. DB::Exception: Cannot parse input")) == 27
    assert is_about_data(DatabaseError("Code: 27. DB::Exception: Cannot parse input"))
    assert error_code(RuntimeError("no code")) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _purger(rss: int, **kw) -> tuple[Purger, _Clock]:
    clock = _Clock()
    p = Purger(
        enabled=True, every_s=5.0, min_gap_s=0.25, above_bytes=400, rss=lambda: rss,
        monotonic=clock, **kw,
    )  # fmt: skip
    return p, clock


def test_quiet_purges_at_most_every_interval():
    p, clock = _purger(rss=0)
    assert not p.due_after_write(quiet=True)  # just created: the last purge is now
    clock.now += 5.0
    assert not p.due_after_write(quiet=False)  # a request on its way
    assert p.due_after_write(quiet=True)
    clock.now += 4.9
    assert not p.due_after_write(quiet=True)


def test_under_load_purges_only_past_the_rss_threshold_and_the_gap():
    p, clock = _purger(rss=500)
    clock.now += 0.2
    assert not p.due_after_write(quiet=False) and not p.due_before_decode()
    clock.now += 0.05
    assert p.due_before_decode()
    clock.now += 0.25
    assert p.due_after_write(quiet=False)
    low, clock = _purger(rss=399)
    clock.now += 1.0
    assert not low.due_after_write(quiet=False) and not low.due_before_decode()


def test_without_under_load_only_quiet_purges():
    p, clock = _purger(rss=500, under_load=False)
    clock.now += 1.0
    assert not p.due_after_write(quiet=False) and not p.due_before_decode()
    clock.now += 4.0
    assert p.due_after_write(quiet=True)


def test_a_disabled_purger_never_purges():
    off = Purger(enabled=False, every_s=0.0, rss=lambda: 1 << 40)
    assert not off.due_after_write(quiet=True) and not off.due_before_decode()
