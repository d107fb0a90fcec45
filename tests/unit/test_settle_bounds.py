"""analytics._sql.settled's pure decisions: the next settle's bounds and its slices."""

from __future__ import annotations

import itertools

import pytest

from analytics._sql.anomalies import PASSES
from analytics._sql.settled import STATE_KIND_BITS, KeyRange, key_ranges, settle_bounds, slices_for


def test_a_settle_runs_from_the_watermark_to_the_lag_before_the_clock():
    assert settle_bounds(0, 100_000, 30) == (0, 70_000)
    assert settle_bounds(50_000, 100_000, 30) == (50_000, 70_000)
    assert settle_bounds(70_000, 100_000, 30) is None  # nothing new behind the lag
    assert settle_bounds(90_000, 100_000, 30) is None
    assert settle_bounds(99_999, 100_000, 0) == (99_999, 100_000)
    assert settle_bounds(0, 100_000, 0.5) == (0, 99_500)


def test_a_negative_lag_is_refused():
    with pytest.raises(ValueError, match="lag_s must be >= 0"):
        settle_bounds(0, 100_000, -1)


def test_a_big_backlog_is_settled_in_bounded_slices():
    assert slices_for(0) == 1
    assert slices_for(500_000) == 1
    assert slices_for(500_001) == 2
    assert slices_for(2_666_666) == 6


def _in(r: KeyRange, key: tuple[str, str]) -> bool:
    return (r.lo is None or key >= r.lo) and (r.hi is None or key < r.hi)


def test_a_backlog_is_cut_into_key_ranges_that_cover_every_key_once():
    keys = [(t, f"h{i:05d}") for t in ("acme", "globex") for i in range(1000)]
    sample = keys[::7][::-1]  # any order
    ranges = key_ranges(sample, 4)
    assert len(ranges) == 4
    assert ranges[0].lo is None and ranges[-1].hi is None
    assert all(a.hi == b.lo for a, b in itertools.pairwise(ranges))
    for key in keys:
        assert sum(_in(r, key) for r in ranges) == 1
    sizes = [sum(_in(r, k) for k in keys) for r in ranges]
    assert min(sizes) > 400 and max(sizes) < 600  # about equal


def test_one_slice_or_no_sample_is_one_unbounded_range():
    assert key_ranges([("a", "x")], 1) == [KeyRange()]
    assert key_ranges([], 5) == [KeyRange()]
    assert KeyRange().sql() == "1" and KeyRange().params() == {}
    # a sample smaller than the slices asked for gives fewer, still covering ranges
    assert key_ranges([("a", "x"), ("a", "y")], 10) == [
        KeyRange(None, ("a", "y")),
        KeyRange(("a", "y"), None),
    ]


def test_a_key_range_is_bound_through_parameters():
    r = KeyRange(("ac'me", "h1"), ("globex", "h2"))
    assert "'" not in r.sql()
    assert r.params() == {"lo_t": "ac'me", "lo_h": "h1", "hi_t": "globex", "hi_h": "h2"}


def test_a_cohort_reads_the_copy_unless_its_live_handoffs_cover_the_summary():
    from analytics._sql.watermarks import GRANULE_ROWS, Settled

    assert Settled(0, 0).source == "summary"  # nothing settled
    assert Settled(0, 5, 10**6).source == "summary"
    assert Settled(1, 0, 10**6).source == "copy"  # nothing live
    assert Settled(1, 0, 0).source == "copy"
    # live handoffs spread over the summary's granules: a few are read with the copy, many
    # touch most granules, and the summary alone is read
    stored = 1000 * GRANULE_ROWS
    assert Settled(1, 499, stored).source == "both"
    assert Settled(1, 501, stored).source == "summary"
    assert Settled(1, 1, 6).source == "summary"


def test_the_state_pass_trusts_a_settle_state_only_with_the_flags_at_the_copys_watermark():
    from analytics._sql.watermarks import Settled

    assert not Settled(5, 0).flags_match  # the flags' watermark was not read
    assert Settled(5, 0, flags_ms=5).flags_match
    assert Settled(0, 0, flags_ms=0).flags_match  # neither settled
    assert not Settled(0, 0, flags_ms=5).flags_match  # flags settled before the copy existed
    assert not Settled(5, 0, flags_ms=4).flags_match


def test_the_relation_passes_trust_a_settle_state_only_with_their_flags_at_its_watermark():
    from analytics._sql.watermarks import Settled

    assert not Settled(5, 0, flags_ms=5).relations_match  # not read
    assert Settled(5, 0, flags_ms=5, relations_ms=5).relations_match
    assert Settled(5, 0, relations_ms=5).relations_match  # each watermark on its own
    assert not Settled(0, 0, relations_ms=5).relations_match
    # a store settled before sql/015: its relation flags have no watermark yet
    assert not Settled(5, 0, flags_ms=5, relations_ms=0).relations_match


def test_a_window_takes_a_settle_state_or_none_and_refuses_anything_else():
    from datetime import UTC, datetime, timedelta

    from analytics import Window
    from analytics._sql.watermarks import Settled

    t = datetime(2026, 11, 20, tzinfo=UTC)
    w = Window(start=t, end=t + timedelta(hours=1))
    assert w.settled is None
    st = Settled(1, 0, 10)
    assert w.against(st).settled == st and w.against(st).shifted(timedelta(hours=1)).settled == st
    with pytest.raises(TypeError, match=r"Window\.settled must be"):
        Window(start=t, end=t + timedelta(hours=1), settled=(1, 0))  # type: ignore[arg-type]


def test_every_state_kind_has_its_own_bit_in_one_byte():
    assert tuple(STATE_KIND_BITS) == PASSES["state"]
    assert sorted(STATE_KIND_BITS.values()) == list(range(len(PASSES["state"])))
    assert max(STATE_KIND_BITS.values()) < 8  # handoff_state_flags.flags is a UInt8


@pytest.mark.parametrize(
    ("variable", "value"),
    [("HANDOFFS_SETTLE_EVERY_S", "often"), ("HANDOFFS_SETTLE_EVERY_S", "-1"),
     ("HANDOFFS_SETTLE_LAG_S", "-0.5"), ("HANDOFFS_SETTLE_LAG_S", "nan")],
)  # fmt: skip
def test_serve_refuses_a_bad_settle_setting_before_opening_the_store(
    tmp_path, monkeypatch, capsys, variable, value
):
    from handoffs.cli import main

    monkeypatch.setenv(variable, value)
    assert main(["serve", "--store", f"chdb://{tmp_path / 'never-opened'}"]) == 2
    err = capsys.readouterr().err
    assert f"{variable} must be 0 or more seconds, got {value!r}" in err
    assert not (tmp_path / "never-opened").exists()
