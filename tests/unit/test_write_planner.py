"""The write planner's rules on plain lists: no store, no threads, no clock."""

from __future__ import annotations

import pytest

from ingest._plan import (
    GROUP_MAX_REQUESTS,
    GROUP_MAX_SPANS,
    PAIR_MIN_SPANS,
    STAGED_MAX_WAIT_S,
    STAGED_WAIT_S,
    Failure,
    Request,
    Shape,
    follower_parts,
    keep_lingering,
    next_take,
    on_failure,
    pick_followers,
    plan_round,
    shape,
    split_in_two,
    use_chdb_decoder,
)


def req(seq: int, spans: int = 100, *, tenant: str = "t", staged: bool = False, bid: str = ""):
    return Request(seq, bid or f"b{seq}", tenant, spans, staged)


def seqs(groups) -> list[list[int]]:
    return [[r.seq for r in g] for g in groups]


# ------------------------------------------------------------------ collecting


def test_the_writer_waits_for_more_only_while_some_are_on_their_way():
    for staged in (True, False):
        assert next_take([req(1, staged=staged)], arriving=True) == STAGED_WAIT_S
        assert next_take([req(1, staged=staged)], arriving=False) == 0.0


def test_collecting_stops_at_the_span_and_request_limits():
    assert next_take([req(1, GROUP_MAX_SPANS)], arriving=True) is None
    assert next_take([req(i, 1) for i in range(GROUP_MAX_REQUESTS)], arriving=True) is None
    assert next_take([req(i, 1) for i in range(GROUP_MAX_REQUESTS - 1)], arriving=False) == 0.0


def test_lingering_only_while_arriving_and_within_the_limit():
    for got in ([req(1, staged=True)], [req(1)]):
        assert keep_lingering(got, arriving=True, lingered_s=0.0)
        assert not keep_lingering(got, arriving=True, lingered_s=STAGED_MAX_WAIT_S)
        assert not keep_lingering(got, arriving=False, lingered_s=0.0)
    assert not keep_lingering([], arriving=True, lingered_s=0.0)


# ------------------------------------------------------------------ grouping


def test_the_requests_of_a_decoder_share_a_group_whatever_their_tenants():
    plan = plan_round(
        [req(1), req(2), req(3, tenant="u"), req(4, tenant="u"), req(5, staged=True)], set()
    )
    assert seqs(plan.groups) == [[1, 2, 3, 4], [5]]
    assert plan.duplicates == () and plan.later == ()


def test_the_other_decoders_requests_in_between_do_not_split_a_group():
    # a probe tenant's tiny Python-decoded requests between a load's chDB-decoded ones
    load = [req(s, 1000, staged=True) for s in (1, 3, 5, 7)]
    probes = [req(s, 2, tenant="probe") for s in (2, 4, 6)]
    plan = plan_round(sorted(load + probes, key=lambda r: r.seq), set())
    assert seqs(plan.groups) == [[1, 3, 5, 7], [2, 4, 6]]  # in the order of their first request


def test_a_full_group_is_followed_by_a_new_one_of_its_decoder():
    half = GROUP_MAX_SPANS // 2
    reqs = [req(1, half), req(2, 1, staged=True), req(3, half), req(4, half), req(5, 1)]
    assert seqs(plan_round(reqs, set()).groups) == [[1, 3], [2], [4, 5]]


def test_a_group_holds_at_most_the_span_limit():
    half = GROUP_MAX_SPANS // 2
    plan = plan_round([req(1, half), req(2, half), req(3, 1)], set())
    assert seqs(plan.groups) == [[1, 2], [3]]


def test_known_batch_ids_are_duplicates_and_second_copies_come_later():
    plan = plan_round([req(1, bid="x"), req(2, bid="a"), req(3, bid="a")], {"x"})
    assert [r.seq for r in plan.duplicates] == [1]
    assert [r.seq for r in plan.later] == [3]
    assert seqs(plan.groups) == [[2]]


def test_a_replayed_logged_group_stays_whole_whatever_its_size_or_kinds():
    reqs = [req(2, GROUP_MAX_SPANS), req(1, 5, staged=True), req(3, 5)]
    plan = plan_round(reqs, set(), regroup=True)
    assert seqs(plan.groups) == [[1, 2, 3]]  # in spool order


def test_groups_are_in_spool_order():
    assert seqs(plan_round([req(5), req(2), req(9)], set()).groups) == [[2, 5, 9]]


# ------------------------------------------------------------------ shaping


def _staged(n: int, spans: int) -> list[Request]:
    return [req(i + 1, spans, staged=True) for i in range(n)]


@pytest.mark.parametrize(
    ("group", "kw", "expected"),
    [
        (_staged(4, 2_500), {"last": True, "arriving": False}, Shape.HALVES_IF_QUIET),
        (_staged(4, 2_500), {"last": False, "arriving": False}, Shape.HALVES_IF_QUIET),
        (_staged(4, 2_500), {"last": True, "arriving": True}, Shape.OVERLAP),
        (_staged(4, 2_500), {"last": False, "arriving": True}, Shape.WHOLE),
        (_staged(1, PAIR_MIN_SPANS), {"last": True, "arriving": False}, Shape.OVERLAP),
        (_staged(2, PAIR_MIN_SPANS // 2 - 1), {"last": True, "arriving": False}, Shape.OVERLAP),
        (_staged(2, PAIR_MIN_SPANS // 2 - 1), {"last": False, "arriving": False}, Shape.WHOLE),
        ([req(1, 5_000), req(2, 5_000)], {"last": True, "arriving": False}, Shape.WHOLE),
    ],
    ids=[
        "large-quiet",
        "large-not-last",
        "large-arriving-last",
        "large-arriving",
        "one-request",
        "too-small-last",
        "too-small",
        "python-decoded",
    ],
)
def test_shape(group, kw, expected):
    assert shape(group, paired=True, replay=False, **kw) is expected


def test_without_a_second_connection_or_on_replay_a_group_is_written_whole():
    group = _staged(4, 2_500)
    assert shape(group, last=True, arriving=False, paired=False, replay=False) is Shape.WHOLE
    assert shape(group, last=True, arriving=False, paired=True, replay=True) is Shape.WHOLE


def test_split_in_two_gives_the_first_half_at_least_half_the_spans():
    a, b = split_in_two([req(1, 10), req(2, 10), req(3, 10), req(4, 10)])
    assert ([r.seq for r in a], [r.seq for r in b]) == ([1, 2], [3, 4])
    a, b = split_in_two([req(1, 1), req(2, 1), req(3, 100)])
    assert ([r.seq for r in a], [r.seq for r in b]) == ([1, 2], [3])  # never empty
    a, b = split_in_two([req(1, 100), req(2, 1)])
    assert ([r.seq for r in a], [r.seq for r in b]) == ([1], [2])
    with pytest.raises(ValueError):
        split_in_two([req(1)])


# ------------------------------------------------------------------ followers


def test_followers_are_staged_requests_at_the_head_of_the_queue():
    group = [req(1, staged=True, bid="g")]
    head = [
        req(2, staged=True),
        req(3, staged=True),
        req(4),  # Python-decoded: stops the run
        req(5, staged=True),
    ]
    assert pick_followers(head, group, set()) == 2
    assert pick_followers([req(2, staged=True, tenant="u")], group, set()) == 1  # any tenant
    assert pick_followers([None, req(2, staged=True)], group, set()) == 0  # a stop marker
    assert pick_followers([req(2, staged=True, bid="k")], group, {"k"}) == 0  # known
    assert pick_followers([req(2, staged=True, bid="g")], group, set()) == 0  # in the group
    twice = [req(2, staged=True, bid="d"), req(3, staged=True, bid="d")]
    assert pick_followers(twice, group, set()) == 1
    assert pick_followers([req(2, GROUP_MAX_SPANS + 1, staged=True)], group, set()) == 0
    assert pick_followers(head, [], set()) == 0


def test_followers_go_in_two_halves_from_the_pair_minimum():
    small = [req(3, 100, staged=True), req(2, 100, staged=True)]
    assert seqs(follower_parts(small)) == [[2, 3]]
    large = [req(i, 2_500, staged=True) for i in range(1, 5)]
    assert seqs(follower_parts(large)) == [[1, 2], [3, 4]]
    assert seqs(follower_parts([req(1, PAIR_MIN_SPANS, staged=True)])) == [[1]]
    assert follower_parts([]) == ()


# ------------------------------------------------------------------ failures


def _fail(**kw):
    args = {
        "about_data": True,
        "refusals": 20,
        "max_refusals": 20,
        "nothing_visible": True,
        "stopping": False,
    }
    return on_failure(**{**args, **kw})


def test_only_refused_data_with_nothing_visible_is_parked():
    assert _fail() is Failure.PARK
    assert _fail(members=1) is Failure.PARK
    assert _fail(refusals=19) is Failure.RETRY
    assert _fail(nothing_visible=False) is Failure.RETRY  # part of it is in: never parked
    assert _fail(about_data=False, refusals=1000) is Failure.RETRY  # unavailable store


def test_a_refused_group_of_several_requests_is_split_before_anything_is_parked():
    assert _fail(members=2) is Failure.SPLIT
    assert _fail(members=2, refusals=19) is Failure.RETRY
    assert _fail(members=2, nothing_visible=False) is Failure.RETRY


def test_once_stopping_a_failed_write_is_left_in_the_spool():
    assert _fail(about_data=False, stopping=True) is Failure.GIVE_UP
    assert _fail(nothing_visible=False, stopping=True) is Failure.GIVE_UP
    assert _fail(stopping=True) is Failure.PARK  # a park is final either way


# ------------------------------------------------------------------ decoder


def test_large_bodies_go_to_chdb_and_smaller_ones_only_with_others_in_flight():
    kib = 1024
    always = 256 * kib
    assert use_chdb_decoder(always, min_bytes=always, others=0)
    assert use_chdb_decoder(10 * always, min_bytes=always, others=3)
    # an SDK's 512-span request (~180 KB) alone: a sender waiting for each answer
    assert not use_chdb_decoder(180 * kib, min_bytes=always, others=0)
    assert use_chdb_decoder(180 * kib, min_bytes=always, others=1)  # two senders at once
    assert use_chdb_decoder(200, min_bytes=always, others=1)  # shares the round's write
    assert not use_chdb_decoder(200, min_bytes=always, others=0)
    assert not use_chdb_decoder(0, min_bytes=always, others=2)  # nothing to decode
    assert use_chdb_decoder(1, min_bytes=0, others=0)  # --decoder sql
