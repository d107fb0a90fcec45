"""The pure parts of serve's too-many-parts gate (ingest._parts), with plain values: rows of
system.parts -> each table's fullest partition, the verdict against the limit, one log line
per episode each way, when system.parts is read, and the warning about a limit the engine's
own thresholds make useless; and the refusal the gRPC receiver answers with."""

from __future__ import annotations

import grpc
import pytest

from foundation.store import StoreUnavailable
from ingest._otlp_grpc import refusal_for
from ingest._parts import (
    PARTS_RETRY_AFTER_S,
    Cadence,
    EngineLimits,
    PartsSnapshot,
    TableParts,
    TooManyParts,
    episode_note,
    limit_problem,
    overload,
    snapshot_from_rows,
)

ENGINE = EngineLimits(delay_at=1000, throw_at=3000)


def test_each_table_is_its_fullest_partition_tables_by_name():
    rows = [
        ("otel_traces", "20260101", 4),
        ("otel_traces", "20260102", 9),
        ("handoff_summary", "all", 7),
        ("transition_ledger", "202601", 2),
    ]
    snap = snapshot_from_rows(rows)
    assert snap.tables == (
        TableParts("handoff_summary", "all", 7),
        TableParts("otel_traces", "20260102", 9),
        TableParts("transition_ledger", "202601", 2),
    )
    assert snap.fullest() == TableParts("otel_traces", "20260102", 9)


def test_a_tie_within_a_table_names_the_smaller_partition_and_an_empty_store_has_none():
    snap = snapshot_from_rows([("t", "b", 3), ("t", "a", 3)])
    assert snap.tables == (TableParts("t", "a", 3),)
    assert PartsSnapshot().fullest() is None
    assert overload(PartsSnapshot(), 1) is None


def test_over_means_more_than_the_limit_in_one_partition():
    snap = snapshot_from_rows([("a", "all", 300), ("b", "1", 120), ("b", "2", 120)])
    assert overload(snap, 300) is None  # at the limit: still admitted
    assert overload(snap, 299) == TableParts("a", "all", 300)
    # parts of different partitions do not add up: the engine's limits are per partition
    assert overload(snapshot_from_rows([("b", "1", 200), ("b", "2", 200)]), 300) is None


def test_limit_zero_never_refuses_and_a_negative_limit_is_refused():
    snap = snapshot_from_rows([("a", "all", 5000)])
    assert overload(snap, 0) is None
    with pytest.raises(ValueError, match="limit must be >= 0, got -1"):
        overload(snap, -1)


def test_one_line_when_refusing_starts_and_one_when_it_ends():
    over = snapshot_from_rows([("handoff_summary", "all", 320), ("otel_traces", "20260101", 40)])
    still = snapshot_from_rows([("handoff_summary", "all", 330)])
    within = snapshot_from_rows([("handoff_summary", "all", 12), ("otel_traces", "x", 40)])
    start = episode_note(None, over, limit=300, engine=ENGINE)
    assert start is not None
    assert "table handoff_summary holds 320 active parts in partition 'all'" in start
    assert "limit 300" in start and "past 1000" in start and "past 3000" in start
    assert "503 + Retry-After" in start
    was = TableParts("handoff_summary", "all", 330)
    assert episode_note(was, still, limit=300, engine=ENGINE) is None  # goes on: silent
    end = episode_note(was, within, limit=300, engine=ENGINE)
    assert end is not None and "accepting requests again" in end
    assert "fullest partition now: table otel_traces at 40" in end
    assert episode_note(None, within, limit=300, engine=ENGINE) is None  # never began


def test_system_parts_is_read_each_period_while_writing_or_refusing_else_rarely():
    c = Cadence(every_s=1.0, idle_s=30.0)
    assert c.due(0.0, None, wrote=False, refusing=False)  # never read: now
    assert not c.due(10.5, 10.0, wrote=True, refusing=False)
    assert c.due(11.0, 10.0, wrote=True, refusing=False)
    assert c.due(11.0, 10.0, wrote=False, refusing=True)  # merges may have freed parts
    assert not c.due(39.0, 10.0, wrote=False, refusing=False)  # idle: merges only lower it
    assert c.due(40.0, 10.0, wrote=False, refusing=False)


def test_a_limit_at_or_above_the_engines_delay_threshold_is_reported():
    assert limit_problem(300, ENGINE) is None
    assert limit_problem(999, ENGINE) is None
    problem = limit_problem(1000, ENGINE)
    assert problem is not None and "not below the engine's parts_to_delay_insert (1000" in problem
    off = limit_problem(0, ENGINE)
    assert off is not None and "no active parts limit" in off


def test_too_many_parts_is_unavailable_with_its_own_retry_delay_over_grpc():
    exc = TooManyParts("too many parts: table t holds 400 active parts")
    assert isinstance(exc, StoreUnavailable)  # a store not taking writes now, not bad data
    r = refusal_for(exc)
    assert r.code == grpc.StatusCode.UNAVAILABLE
    assert r.reason == "too_many_parts"
    assert r.retry_after_s == PARTS_RETRY_AFTER_S == 5
    assert "400 active parts" in r.message
