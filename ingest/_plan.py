"""The write policy of ingest, as pure functions: queued requests in, write plans out.

No clock, thread or I/O here: the writer thread (ingest._writer_thread) observes the queue, the
requests on their way and the memory headroom, passes them in as plain values, and executes
what comes back. Every number of spans is a count of spans; times are seconds.

Rules (each has a unit test in tests/unit/test_write_planner.py):

* collecting (`next_take`, `keep_lingering`): after the first queued request, take what is
  queued; while a request is on its way, wait up to STAGED_WAIT_S for each further one, up
  to STAGED_MAX_WAIT_S in all; stop at GROUP_MAX_REQUESTS requests or GROUP_MAX_SPANS
  spans, or at a stop marker.
* grouping (`plan_round`): known batch ids are duplicates (skipped, committed); a second
  copy of a batch id in the same round is a duplicate once the first is stored; the requests
  of one decoder become one group of at most GROUP_MAX_SPANS spans, whatever their tenants
  (every row carries its tenant: a write costs a fixed ~0.1 s, so a round writes one group
  per decoder however many tenants sent, not one per tenant); groups are written in the
  order of their first request, each in spool order (a replayed logged group is kept whole,
  whatever its kinds or size).
* shaping (`shape`): a chDB-decoded group of two or more requests and PAIR_MIN_SPANS spans
  or more, written while no request is on its way, is written as two halves at once
  (`split_in_two`); the last group of a round may take followers (`Shape.OVERLAP`).
* followers (`pick_followers`, `follower_parts`): while a group's data are written,
  chDB-decoded requests at the head of the queue (not known, not in the
  group, up to GROUP_MAX_SPANS) are taken and written at once, in two halves from
  PAIR_MIN_SPANS, unless serve has no memory headroom.
* decoder (`use_chdb_decoder`): a protobuf body of SQL_MIN_BYTES or more is decoded by
  chDB; a smaller one too while other requests of SQL_JOIN_MIN_BYTES or more are being
  received or decoded, so that they share one decoding round and one write (one write per
  round instead of one per decoder); a request alone below SQL_MIN_BYTES (one sender
  waiting for each answer) stays on the Python decoder, sooner for it.
* failures (`on_failure`): see ingest._refusals for which errors are about the data; a
  refused group of several requests is split before anything is parked.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "GROUP_MAX_REQUESTS",
    "GROUP_MAX_SPANS",
    "PAIR_MIN_SPANS",
    "STAGED_MAX_WAIT_S",
    "STAGED_WAIT_S",
    "Failure",
    "Request",
    "Round",
    "Shape",
    "follower_parts",
    "keep_lingering",
    "next_take",
    "on_failure",
    "pick_followers",
    "plan_round",
    "shape",
    "split_in_two",
    "use_chdb_decoder",
]

# spans per insert: 4x 5,000 (fewer parts: less fixed cost per write and fewer merges)
GROUP_MAX_SPANS = 20_000
GROUP_MAX_REQUESTS = 64
PAIR_MIN_SPANS = 8_000  # a group smaller than this is written whole (see shape)
#: a write costs a fixed ~0.1 s (query analysis, one part per table): the writer waits this
#: long for each further request while some are on their way
STAGED_WAIT_S = 0.05
STAGED_MAX_WAIT_S = 0.5  # ... and this long in all (stored at most this late)


@dataclass(frozen=True, slots=True)
class Request:
    """One queued request as the planner sees it: spool sequence number, batch id, tenant,
    spans (count), whether chDB decoded it (staged) and its body size (bytes)."""

    seq: int
    batch_id: str
    tenant: str
    spans: int
    staged: bool = False
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Round:
    """What to do with the requests the writer took together: `groups` to write (each in
    spool order, one dedup token each), `duplicates` already stored (commit, skip) and
    `later` (second copies of a request of this round: duplicates once it is stored)."""

    groups: tuple[tuple[Request, ...], ...] = ()
    duplicates: tuple[Request, ...] = ()
    later: tuple[Request, ...] = field(default=())


class Shape(enum.Enum):
    """How one group is written."""

    WHOLE = "whole"  # one write, retried until stored
    HALVES_IF_QUIET = "halves"  # two halves at once on two connections once nobody arrives
    OVERLAP = "overlap"  # one write; requests arriving meanwhile are written alongside


class Failure(enum.Enum):
    """What to do after a write failed."""

    RETRY = "retry"  # the store is unavailable: keep the records, back off, retry
    GIVE_UP = "give_up"  # stopping: leave the records in the spool for the next start
    PARK = "park"  # the store refuses this data every time and none of it is visible
    SPLIT = "split"  # ... and the group has several requests: write each alone


def next_take(got: Sequence[Request], *, arriving: bool) -> float | None:
    """How to take the next request after `got` (at least one): None to stop collecting,
    0.0 to take one only if queued now, else the seconds to wait for one (while a request
    is on its way: a write has a fixed cost, ~0.1 s for chDB-decoded requests, that more
    requests share)."""
    if len(got) >= GROUP_MAX_REQUESTS or sum(x.spans for x in got) >= GROUP_MAX_SPANS:
        return None
    return STAGED_WAIT_S if arriving else 0.0


def keep_lingering(got: Sequence[Request], *, arriving: bool, lingered_s: float) -> bool:
    """After finding the queue empty: go on waiting for requests on their way? While some
    are, for at most STAGED_MAX_WAIT_S since the round's first request."""
    return bool(got) and arriving and lingered_s < STAGED_MAX_WAIT_S


def plan_round(
    requests: Sequence[Request], known: Container[str], *, regroup: bool = False
) -> Round:
    """Group the requests of one round (see the module docstring). `regroup`: they are one
    logged group (a replay), written as one group whatever its size or kinds."""
    groups: list[list[Request]] = []
    open_group: dict[bool, list[Request]] = {}  # staged -> the decoder's last group
    placed: set[str] = set()
    duplicates: list[Request] = []
    later: list[Request] = []
    for it in requests:
        if it.batch_id in known:
            duplicates.append(it)
            continue
        if it.batch_id in placed:
            later.append(it)
            continue
        placed.add(it.batch_id)
        if regroup:
            if not groups:
                groups.append([])
            groups[0].append(it)
            continue
        key = it.staged
        group = open_group.get(key)
        if group is not None and sum(x.spans for x in group) + it.spans <= GROUP_MAX_SPANS:
            group.append(it)
        else:
            open_group[key] = [it]
            groups.append(open_group[key])
    return Round(
        tuple(tuple(sorted(g, key=lambda x: x.seq)) for g in groups),
        tuple(duplicates),
        tuple(later),
    )


def shape(
    group: Sequence[Request], *, last: bool, arriving: bool, paired: bool, replay: bool
) -> Shape:
    """How to write `group`. `last`: the round's last group; `arriving`: a request is on its
    way now; `paired`: a second store connection can be used (the chDB path); `replay`:
    written at start from the spool (one at a time, as logged)."""
    if replay or not paired or not group or not all(x.staged for x in group):
        return Shape.WHOLE
    if len(group) >= 2 and not arriving and sum(x.spans for x in group) >= PAIR_MIN_SPANS:
        return Shape.HALVES_IF_QUIET
    return Shape.OVERLAP if last else Shape.WHOLE


def split_in_two(group: Sequence[Request]) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    """`group` (two or more requests) as two groups in order, the first with at least half
    of the spans and the second never empty."""
    if len(group) < 2:
        raise ValueError("split_in_two: needs two requests or more")
    total, acc, half = sum(x.spans for x in group), 0, len(group) - 1
    for i, x in enumerate(group[:-1], 1):
        acc += x.spans
        if acc * 2 >= total:
            half = i
            break
    return tuple(group[:half]), tuple(group[half:])


def pick_followers(
    head: Iterable[Request | None], group: Sequence[Request], known: Container[str]
) -> int:
    """How many requests at the head of the queue (None: a stop marker) join the running
    `group`'s write as followers: chDB-decoded, not known, not in the
    group or repeated, up to GROUP_MAX_SPANS spans in all."""
    if not group:
        return 0
    ids = {x.batch_id for x in group}
    n, spans = 0, 0
    for it in head:
        if (
            it is None
            or not it.staged
            or it.batch_id in known
            or it.batch_id in ids
            or spans + it.spans > GROUP_MAX_SPANS
        ):
            break
        ids.add(it.batch_id)
        spans += it.spans
        n += 1
    return n


def follower_parts(followers: Sequence[Request]) -> tuple[tuple[Request, ...], ...]:
    """The followers as the groups written at once (in spool order): two halves from
    PAIR_MIN_SPANS spans and two requests, else one group."""
    ordered = tuple(sorted(followers, key=lambda x: x.seq))
    if len(ordered) > 1 and sum(x.spans for x in ordered) >= PAIR_MIN_SPANS:
        return split_in_two(ordered)
    return (ordered,) if ordered else ()


def use_chdb_decoder(nbytes: int, *, min_bytes: int, others: int) -> bool:
    """Whether chDB decodes a protobuf body of `nbytes` bytes (`min_bytes`: the size from
    which it always does; `others`: how many other announced requests, of
    SQL_JOIN_MIN_BYTES or more, are being received or decoded now). A body alone goes to
    Python below `min_bytes`: a sender waiting for each answer gets it sooner. With others
    in flight, it joins chDB's round: the requests share one decoding round trip and one
    write instead of each paying Python's decoding under the GIL and a write of its own."""
    return nbytes > 0 and (nbytes >= min_bytes or others > 0)


def on_failure(
    *,
    about_data: bool,
    refusals: int,
    max_refusals: int,
    nothing_visible: bool,
    stopping: bool,
    members: int = 1,
) -> Failure:
    """After a failed write of a group: `about_data` (ingest._refusals.is_about_data),
    `refusals` (count of such failures for this group, this one included), `nothing_visible`
    (no row of the group is in the store: checked after the failure), `stopping` (stop()
    was called: no retry), `members` (requests in the group). A group is parked only when
    the store refused its data `max_refusals` times and none of it is visible, and only a
    group of one request: a group of several is split into its requests, each written
    alone, so that one request the store refuses parks no other (of its tenant or
    another's); otherwise it is retried (or, stopping, left in the spool)."""
    if about_data and refusals >= max_refusals and nothing_visible:
        return Failure.SPLIT if members > 1 else Failure.PARK
    return Failure.GIVE_UP if stopping else Failure.RETRY
