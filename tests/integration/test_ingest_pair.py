"""The writer thread against real chDB: the last large chDB-decoded group before the writer
goes idle is written as two groups at once, on two connections; requests arriving during a
write go in alongside it; a failed half or follower is written again the usual way. Every
span stored once and the hash chain intact. Which group goes where is the planner's
(tests/unit/test_write_planner.py); here the writer thread executes it. Faults and holds are
injected through `backend=` (tests/integration/_backends.py), never by patching.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from foundation.store import StoreSpec, connect
from ingest._decode import PROTOBUF
from ingest._purge import Purger
from ingest._service import Ingestor
from ingest._spool import Spool
from ingest._verify import verify_chain
from ingest.chdb import Stager
from ingest.testing import create_spans, request_protobuf
from tests.integration._backends import Held

_PER_REQUEST = 2_500  # 4 requests: 10,000 spans, above the planner's PAIR_MIN_SPANS


def _body(k: int) -> bytes:
    return request_protobuf(create_spans(k, _PER_REQUEST, prefix="h-pair"))


@pytest.fixture(scope="module")
def bodies() -> list[bytes]:
    return [_body(k) for k in range(5)]


@pytest.fixture
def make_ingestor(chdb_client, chdb_path: Path, tmp_path: Path, fresh_db: str):
    """Factory: a started Ingestor with chDB decoding every request (keyword options go to
    Ingestor); stopped afterwards."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    made: list[tuple[Ingestor, Stager]] = []

    def make(**kw) -> Ingestor:
        stager = Stager(lambda: connect(spec, database=""), tmp_path / f"stage{len(made)}")
        ing = Ingestor(
            chdb_client,
            fresh_db,
            Spool(tmp_path / f"spool{len(made)}", max_bytes=1 << 30),
            stager=stager,
            sql_min_bytes=1,
            **kw,
        )
        ing.start()
        made.append((ing, stager))
        return ing

    yield make
    for ing, stager in made:
        ing.stop()
        stager.close()


def _submit_together(ing: Ingestor, bodies: list[bytes]) -> None:
    """All at once: the writer lingers while they are inside submit() and takes them as one
    group; nothing follows, so that group is the last before it goes idle."""
    barrier = threading.Barrier(len(bodies))
    errors: list[BaseException] = []

    def one(body: bytes) -> None:
        barrier.wait()
        try:
            ing.submit(body, PROTOBUF, tenant="default")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert ing.wait_idle(60)


def _assert_stored_once(client, db: str, batches: int) -> None:
    total = batches * _PER_REQUEST
    spans = client.query(f"SELECT count(), uniqExact(SpanId) FROM {db}.otel_traces").result_rows
    ledger = client.query(f"SELECT count() FROM {db}.transition_ledger").result_rows
    assert spans == [(total, total)] and ledger == [(total,)]
    report = verify_chain(client, db)
    assert report.ok and report.batches == batches and len(report.heads) == 1, report


def test_last_group_is_written_as_two_halves_at_once(chdb_client, fresh_db, make_ingestor, bodies):
    ing = make_ingestor()
    _submit_together(ing, bodies[:4])
    assert ing.health()["sql_decoded"] == 4  # decoded by chDB
    assert (ing.stats["pair_writes"], ing.stats["pair_fallbacks"]) == (1, 0)
    assert ing.stats["writes"] == 2  # the two halves, each its own group and token
    _assert_stored_once(chdb_client, fresh_db, 4)


def test_a_failed_half_is_written_again_the_usual_way(chdb_client, fresh_db, make_ingestor, bodies):
    # the second half's data go in, then the connection drops before the answer arrives
    writer = Held(chdb_client, fresh_db, hold=False, lose_other_once=True)
    ing = make_ingestor(backend=writer)
    _submit_together(ing, bodies[:4])
    assert writer.lost == 1
    assert (ing.stats["pair_writes"], ing.stats["pair_fallbacks"]) == (0, 1)
    _assert_stored_once(chdb_client, fresh_db, 4)


def _overlapped(ing: Ingestor, writer: Held, bodies: list[bytes], followers: int) -> None:
    """One request whose data write is held until `followers` more requests arrived and,
    nothing else arriving, were taken off the queue and their data written alongside it."""
    ing.submit(bodies[0], PROTOBUF, tenant="default")
    assert writer.entered.wait(30)
    for body in bodies[1 : 1 + followers]:  # while the first one's write is held
        ing.submit(body, PROTOBUF, tenant="default")
    halves = 2 if followers >= 4 else 1
    assert writer.wait_others_done(halves, 30), "the followers were never taken"
    # the followers' data are in; their chain rows wait for the held group's
    assert ing.stats["batches"] == 0, "a chain row went in before its predecessor's"
    writer.release.set()
    assert ing.wait_idle(60)


def test_requests_arriving_during_a_write_are_written_alongside_it(
    chdb_client, fresh_db, make_ingestor, bodies
):
    """The end of a burst: requests acknowledged while the writer is busy with a group are
    not left for the next write; their data go in at once on a second connection, the
    chain rows after the running group's, in order: each stored once, the chain intact."""
    writer = Held(chdb_client, fresh_db)
    ing = make_ingestor(backend=writer)
    _overlapped(ing, writer, bodies, followers=2)
    assert ing.stats["overlapped_writes"] == 1
    assert ing.stats["writes"] == 2  # the held group, then the two followers as one
    _assert_stored_once(chdb_client, fresh_db, 3)
    assert ing.spool.backlog_bytes == 0


def test_many_requests_arriving_during_a_write_go_in_as_two_halves_at_once(
    chdb_client, fresh_db, make_ingestor, bodies
):
    """Followers of PAIR_MIN_SPANS or more (here 4 x 2,500 spans) are written as two groups
    at once, one on each extra connection, so that both cores write at the end of a burst;
    chain rows in order, each span stored once."""
    writer = Held(chdb_client, fresh_db)
    ing = make_ingestor(backend=writer)
    _overlapped(ing, writer, bodies, followers=4)
    used = writer.during_hold
    assert len(used) == 2 and used[0] is not used[1]  # the two halves, one per connection
    assert chdb_client not in used
    assert ing.stats["overlapped_writes"] == 1
    assert ing.stats["writes"] == 3  # the held group, then each half as its own group
    _assert_stored_once(chdb_client, fresh_db, 5)
    assert ing.spool.backlog_bytes == 0
    assert len(ing.spool.groups()) == 4  # both halves logged as groups of two


@pytest.mark.parametrize("followers", [2, 4], ids=["one-group", "two-halves"])
def test_a_failed_overlapped_write_is_written_again_the_usual_way(
    chdb_client, fresh_db, make_ingestor, bodies, followers
):
    writer = Held(chdb_client, fresh_db, lose_other_once=True)
    ing = make_ingestor(backend=writer)
    _overlapped(ing, writer, bodies, followers)
    assert writer.lost == 1
    assert ing.stats["overlapped_writes"] == 1
    _assert_stored_once(chdb_client, fresh_db, 1 + followers)
    assert ing.spool.backlog_bytes == 0


def test_past_the_memory_limit_requests_arriving_during_a_write_wait_for_it(
    chdb_client, fresh_db, make_ingestor, bodies
):
    """Three writes at once are serve's memory peak: at overlap_max_rss the followers stay
    queued while the running write holds, and go in after it (as two halves at once); each
    span stored once, the chain intact."""
    checked = threading.Event()

    def rss() -> int:  # serve's resident set, as the writer asks for it: always too high
        checked.set()
        return 1 << 40

    writer = Held(chdb_client, fresh_db)
    ing = make_ingestor(backend=writer, overlap_max_rss=1, rss=rss)
    ing.submit(bodies[0], PROTOBUF, tenant="default")
    assert writer.entered.wait(30)
    for body in bodies[1:5]:
        ing.submit(body, PROTOBUF, tenant="default")
    assert checked.wait(30)  # the followers were found, and the memory checked
    assert ing.health()["queued"] == 4  # left on the queue, not taken
    writer.release.set()
    assert ing.wait_idle(60)
    assert ing.stats["overlaps_skipped_for_memory"] == 1
    assert writer.during_hold == [] and ing.stats["overlapped_writes"] == 0
    assert ing.stats["pair_writes"] == 1  # then the four as two halves at once
    _assert_stored_once(chdb_client, fresh_db, 5)
    assert ing.spool.backlog_bytes == 0


def test_the_writer_waits_for_a_request_still_being_received(make_ingestor, bodies):
    """A staged request is not written alone while another one's headers have arrived (the
    HTTP handler announces it with Ingestor.receiving): the two share one write."""
    ing = make_ingestor()
    with ing.receiving(PROTOBUF, len(bodies[1])):  # as the HTTP handler, from its headers
        ing.submit(bodies[0], PROTOBUF, tenant="default")
        time.sleep(0.1)  # the announced body still on the wire: a sender's pace, not a wait
        ing.submit(bodies[1], PROTOBUF, tenant="default")
    assert ing.wait_idle(60)
    assert ing.stats["writes"] == 1 and ing.stats["batches"] == 2


def _purges(client) -> int:
    rows = client.query(
        "SELECT value FROM system.events WHERE event = 'MemoryAllocatorPurge'"
    ).result_rows
    return int(rows[0][0]) if rows else 0


def test_a_quiet_writer_purges_freed_memory_at_most_every_interval(
    chdb_client, fresh_db, tmp_path, bodies
):
    """SYSTEM JEMALLOC PURGE after a write when no request is on its way and the last purge
    is the interval old (here: a clock the test moves); not again within the interval."""
    now = [1000.0]
    purger = Purger(enabled=True, every_s=5.0, above_bytes=1 << 60, monotonic=lambda: now[0])
    now[0] += 5.0  # the last purge was long ago
    ing = Ingestor(
        chdb_client, fresh_db, Spool(tmp_path / "spool", max_bytes=1 << 30), purger=purger
    )
    ing.start()
    try:
        before = _purges(chdb_client)
        ing.submit(bodies[0], PROTOBUF, tenant="default")
        assert ing.wait_idle(60)
        assert purger.purges == 1 and _purges(chdb_client) >= before + 1
        ing.submit(bodies[1], PROTOBUF, tenant="default")  # within the interval
        assert ing.wait_idle(60)
        assert ing.stats["writes"] == 2 and purger.purges == 1
    finally:
        ing.stop()
