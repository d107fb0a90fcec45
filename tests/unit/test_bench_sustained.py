"""bench/_sustained.py with plain values: when a hold at one rate counts as sustained (parts
bounded and flat, the store keeping up, the clients not held back, nothing refused for
parts), which rate the search tries next, and the table of parts it prints."""

from __future__ import annotations

import pytest

from bench._sustained import (
    WRITE_TABLES,
    Hold,
    Sample,
    Verdict,
    early_stop,
    judge,
    next_rate,
    parts_by_table,
    parts_table,
    sustained,
)

RATE = 1000.0  # spans/s


def _samples(parts: list[int], *, rate: float = RATE, stored_lag: list[int] | None = None,
             refused: list[int] | None = None, table: str = "handoff_summary") -> list[Sample]:  # fmt: skip
    """One sample a second: `parts[i]` active parts of `table` (10 in the others), spans
    acknowledged at `rate`, stored `stored_lag[i]` behind."""
    lag = stored_lag or [0] * len(parts)
    ref = refused or [0] * len(parts)
    out = []
    for i, n in enumerate(parts):
        acked = int(rate * (i + 1))
        out.append(
            Sample(float(i + 1), {table: n, "otel_traces": 10}, acked, acked - lag[i], ref[i])
        )
    return out


def test_flat_parts_a_store_that_keeps_up_and_the_rate_reached_hold():
    v = judge(_samples([5, 30, 40, 35, 42, 38, 41, 36, 40]), rate=RATE, limit=300)
    assert v.holds, v.why
    assert "parts flat" in v.why and "1,000 spans/s stored" in v.why


def test_the_first_third_is_warm_up_a_climb_there_does_not_count():
    assert judge(_samples([1, 50, 120, 120, 118, 121, 119, 122, 120]), rate=RATE, limit=300).holds


def test_parts_climbing_past_the_tolerance_do_not_hold():
    v = judge(_samples([10, 20, 30, 40, 50, 60, 70, 80, 90]), rate=RATE, limit=300)
    assert not v.holds
    assert v.why == "handoff_summary climbing: median 50 -> 80 active parts (allowed up to 62.5)"
    # within max(10 parts, 25 %): a sawtooth of merges is flat
    assert judge(_samples([10, 20, 30, 40, 48, 41, 50, 46, 49]), rate=RATE, limit=300).holds


def test_a_table_over_serves_limit_or_a_refusal_for_parts_does_not_hold():
    v = judge(_samples([10, 20, 30, 40, 301, 40, 40, 40, 40]), rate=RATE, limit=300)
    assert not v.holds and v.why == "handoff_summary reached 301 active parts at 5 s (limit 300)"
    refused = _samples([10] * 9, refused=[0, 0, 0, 0, 0, 0, 0, 2, 2])
    v = judge(refused, rate=RATE, limit=300)
    assert not v.holds and v.why == "serve refused 2 request(s) for too many parts"
    assert early_stop(refused[:8], limit=300) == "serve refused 2 request(s) for too many parts"
    over = _samples([10, 400])
    assert early_stop(over, limit=300) == "handoff_summary at 400 active parts (limit 300)"
    assert early_stop(over, limit=0) is None  # no limit: only the end of the hold tells
    assert early_stop([], limit=300) is None


def test_a_growing_backlog_is_a_store_that_does_not_keep_up():
    lag = [0, 500, 1000, 2000, 3000, 4000, 6000, 8000, 10000]
    v = judge(_samples([10] * 9, stored_lag=lag), rate=RATE, limit=300)
    assert not v.holds
    assert v.why == (
        "store behind: median 3,000 -> 8,000 spans acknowledged but not stored "
        "(allowed up to 5,000)"
    )
    # a backlog of a write or two in flight is no trend
    wobble = [0, 800, 1500, 700, 1600, 900, 1700, 1200, 800]
    assert judge(_samples([10] * 9, stored_lag=wobble), rate=RATE, limit=300).holds


def test_clients_that_could_not_send_the_rate_do_not_hold():
    slow = _samples([10] * 9, rate=800.0)  # acknowledged at 800 of the 1,000 asked
    v = judge(slow, rate=RATE, limit=300)
    assert not v.holds and v.why == "clients held back: 800 spans/s acknowledged of 1,000 asked"


def test_too_few_samples_cannot_be_judged():
    with pytest.raises(ValueError, match="at least 6 samples to be judged, got 5"):
        judge(_samples([1] * 5), rate=RATE, limit=300)


def _held(rate: float, ok: bool) -> Hold:
    return Hold(rate, Verdict(ok, ""))


def test_the_search_goes_down_until_a_rate_holds_then_bisects():
    cap = 10_000.0
    assert next_rate([], cap) == 9000
    tried = [_held(9000, False)]
    assert next_rate(tried, cap) == 6750
    tried.append(_held(6750, True))
    assert next_rate(tried, cap, refine=2) == 7875  # between 6,750 (held) and 9,000
    tried.append(_held(7875, False))
    assert next_rate(tried, cap, refine=2) == (6750 + 7875) / 2
    tried.append(_held(7312.5, True))
    assert next_rate(tried, cap, refine=2) is None  # two bisections
    assert sustained(tried) == 7312.5


def test_the_search_ends_when_the_first_rate_holds_or_nothing_holds_above_the_floor():
    assert next_rate([_held(9000, True)], 10_000) is None
    assert next_rate([_held(600, False)], 10_000, floor=0.05) is None  # 450 < 500
    assert sustained([_held(600, False)]) is None
    # brackets closer than 10 % are not split again
    assert next_rate([_held(9000, False), _held(8500, True)], 10_000, refine=5) is None
    with pytest.raises(ValueError):
        next_rate([], 0)


def test_parts_per_table_is_the_fullest_partition_and_prints_with_units():
    rows = [("otel_traces", "20260101", 4), ("otel_traces", "20260102", 9), ("t", "all", 2)]
    assert parts_by_table(rows) == {"otel_traces": 9, "t": 2}
    text = parts_table([Sample(5.0, {"otel_traces": 9}, 0, 0), Sample(10.0, {}, 0, 0)])
    lines = text.splitlines()
    assert "count, in the table's fullest partition" in lines[0]
    assert lines[1].split() == ["t", "(s)", *WRITE_TABLES]
    assert lines[2].split() == ["5", "9", *["0"] * (len(WRITE_TABLES) - 1)]
    assert lines[3].split()[0] == "10"
