"""The parts watch (ingest._parts.PartsWatch) driven one read at a time (`tick`) over a small
stand-in for the store's client, which answers system.parts with rows the test sets: the
gate refuses while a table is over the limit and admits again after, one log line each way
(with how long it lasted and how many requests it refused), a read that fails admits
requests, and /metrics shows the counts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from ingest._parts import PartsWatch, TooManyParts


@dataclass
class _Answer:
    result_rows: list[tuple]


@dataclass
class StoreRows:
    """Answers the two queries PartsWatch makes: the engine's limits and the parts."""

    parts: list[tuple[str, str, int]] = field(default_factory=list)
    fail: Exception | None = None
    closed: int = 0

    def query(self, sql: str, parameters: dict | None = None) -> _Answer:
        if self.fail is not None:
            raise self.fail
        if "merge_tree_settings" in sql:
            return _Answer([("parts_to_delay_insert", "1000"), ("parts_to_throw_insert", "3000")])
        assert parameters == {"db": "handoffs"}
        return _Answer(list(self.parts))

    def close(self) -> None:
        self.closed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(store: StoreRows, clock: Clock, limit: int = 300) -> PartsWatch:
    # StoreRows stands in for the client: the two methods PartsWatch calls
    return PartsWatch(lambda: store, "handoffs", limit=limit, clock=clock)  # type: ignore[arg-type, return-value]


def test_refuses_while_a_table_is_over_the_limit_and_says_so_once_each_way(caplog):
    caplog.set_level(logging.INFO, logger="handoffs.parts")
    store, clock = StoreRows([("handoff_summary", "all", 120)]), Clock()
    w = _watch(store, clock)
    w.tick()
    w.admit()  # within the limit
    store.parts = [("handoff_summary", "all", 301), ("otel_traces", "20260101", 40)]
    w.tick()
    for _ in range(3):
        with pytest.raises(TooManyParts) as exc:
            w.admit()
    assert "table handoff_summary holds 301 active parts" in str(exc.value)
    assert exc.value.retry_after_s == 5
    store.parts = [("handoff_summary", "all", 350)]
    w.tick()  # still over: nothing more logged
    clock.now += 12.5
    store.parts = [("handoff_summary", "all", 80)]
    w.tick()
    w.admit()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("serve: too many parts: table handoff_summary holds 301 active")
    assert "accepting requests again after 12.5 s and 3 refused request(s)" in lines[1]


def test_a_read_that_fails_lets_requests_through_and_is_logged_once(caplog):
    store, clock = StoreRows([("t", "all", 500)]), Clock()
    w = _watch(store, clock)
    w.tick()
    with pytest.raises(TooManyParts):
        w.admit()
    store.fail = RuntimeError("Code: 210. connection refused")
    assert w.tick() is None and w.tick() is None
    w.admit()  # fail open
    assert store.closed == 2  # each failed read closes its client; the next one reconnects
    messages = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(messages) == 1 and "cannot read system.parts (Code: 210" in messages[0]
    assert dict(_samples(w))[("handoffs_store_parts_read_errors_total", ())] == 2
    store.fail = None
    assert w.tick() is not None  # readable again: over the limit again
    with pytest.raises(TooManyParts):
        w.admit()


def test_metrics_show_each_tables_fullest_partition_the_limit_and_the_state():
    store = StoreRows([("otel_traces", "20260101", 12), ("otel_traces", "20260102", 30),
                       ("ingest_batches", "all", 401)])  # fmt: skip
    w = _watch(store, Clock(), limit=400)
    w.tick()
    got = dict(_samples(w))
    assert got[("handoffs_store_active_parts", (("table", "otel_traces"),))] == 30
    assert got[("handoffs_store_active_parts", (("table", "ingest_batches"),))] == 401
    assert got[("handoffs_store_active_parts_limit", ())] == 400
    assert got[("handoffs_store_parts_refusing", ())] == 1
    assert got[("handoffs_store_parts_read_errors_total", ())] == 0


def _samples(w: PartsWatch) -> list[tuple[tuple[str, tuple], float]]:
    return [((s.name, tuple(sorted(s.labels.items()))), s.value) for m in w.collect()
            for s in m.samples]  # fmt: skip


def test_a_limit_the_engine_makes_useless_is_warned_about_at_the_first_read(caplog):
    w = _watch(StoreRows(), Clock(), limit=1200)
    w.tick()
    assert any("not below the engine's parts_to_delay_insert (1000" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    with pytest.raises(ValueError):
        _watch(StoreRows(), Clock(), limit=-1)
