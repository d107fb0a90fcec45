"""The last large chDB-decoded group before the writer goes idle is written as two groups at
once, on two connections (ingest._service.Ingestor._write_pair): every span stored once and
the hash chain intact; when a half fails, both are written the usual way, still once. And
the writer's memory purge: when quiet at most every _PURGE_EVERY_S, under load only above
_PURGE_ABOVE_BYTES of RSS."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import ingest._service as service
from foundation.store import StoreSpec, connect
from ingest._decode import PROTOBUF
from ingest._service import Ingestor
from ingest._spool import Spool
from ingest._verify import verify_chain
from ingest.chdb import Stager
from ingest.testing import request_protobuf, span_json, transition

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_PER_REQUEST = 2_500  # 4 requests: 10,000 spans, above _PAIR_MIN_SPANS


def _body(k: int) -> bytes:
    now = time.time_ns()
    spans = [
        span_json(
            trace_id=f"{k + 1:08x}{i + 1:024x}",
            span_id=f"{k + 1:08x}{i + 1:08x}",
            attributes=transition(f"h-pair-{k}-{i}", "create", "", "created"),
            start_ns=now + i,
        )
        for i in range(_PER_REQUEST)
    ]
    return request_protobuf(spans)


@pytest.fixture(scope="module")
def bodies() -> list[bytes]:
    return [_body(k) for k in range(5)]


@pytest.fixture
def ingestor(chdb_client, chdb_path: Path, tmp_path: Path, fresh_db: str):
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / "stage")
    ing = Ingestor(
        chdb_client,
        fresh_db,
        Spool(tmp_path / "spool", max_bytes=1 << 30),
        stager=stager,
        sql_min_bytes=1,
    )
    ing.start()
    yield ing
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


def test_last_group_is_written_as_two_halves_at_once(chdb_client, fresh_db, ingestor, bodies):
    _submit_together(ingestor, bodies[:4])
    assert ingestor.stager is not None and ingestor.stager.staged == 4  # decoded by chDB
    assert (ingestor.stats["pair_writes"], ingestor.stats["pair_fallbacks"]) == (1, 0)
    assert ingestor.stats["writes"] == 2  # the two halves, each its own group and token
    _assert_stored_once(chdb_client, fresh_db, 4)


def test_a_failed_half_is_written_again_the_usual_way(
    chdb_client, fresh_db, ingestor, bodies, monkeypatch
):
    real = service.write_staged_data
    failed: list[int] = []

    def second_connection_fails_once(client, *args, **kwargs):
        if client is not ingestor.client and not failed:
            failed.append(1)
            # the half's data goes in, then the connection drops before the answer arrives
            real(client, *args, **kwargs)
            raise ConnectionError("connection reset by peer")
        return real(client, *args, **kwargs)

    monkeypatch.setattr(service, "write_staged_data", second_connection_fails_once)
    _submit_together(ingestor, bodies[:4])
    assert failed == [1]
    assert (ingestor.stats["pair_writes"], ingestor.stats["pair_fallbacks"]) == (0, 1)
    _assert_stored_once(chdb_client, fresh_db, 4)


def _overlapped(
    ingestor: Ingestor, bodies: list[bytes], monkeypatch, *, b_fails: bool, followers: int = 2
) -> list[Client]:
    """One request whose write is held until `followers` more requests arrived and, nothing
    else arriving, were taken off the queue and written alongside it on the extra
    connections. Returns the connections the followers' data went in on, in order."""
    real = service.write_staged_data
    gate, entered = threading.Event(), threading.Event()
    failed: list[int] = []

    used: list[Client] = []

    def held(client, *args, **kwargs):
        if client is not ingestor.client:
            used.append(client)
        if client is ingestor.client and not gate.is_set():
            entered.set()
            assert gate.wait(60), "the followers were never taken"
        elif client is not ingestor.client and b_fails and not failed:
            failed.append(1)
            real(client, *args, **kwargs)  # in, then the answer is lost
            raise ConnectionError("connection reset by peer")
        return real(client, *args, **kwargs)

    monkeypatch.setattr(service, "write_staged_data", held)
    ingestor.submit(bodies[0], PROTOBUF, tenant="default")
    assert entered.wait(30)
    for body in bodies[1 : 1 + followers]:  # while the first one's write is held
        ingestor.submit(body, PROTOBUF, tenant="default")
    deadline = time.monotonic() + 30
    while ingestor.stats["overlapped_writes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if not b_fails:  # the followers' data are in; their chain rows wait for the held group's
        time.sleep(0.2)
        assert ingestor.stats["batches"] == 0, "a chain row went in before its predecessor's"
    gate.set()
    assert ingestor.wait_idle(60)
    assert failed == ([1] if b_fails else [])
    return used


def test_requests_arriving_during_a_write_are_written_alongside_it(
    chdb_client, fresh_db, ingestor, bodies, monkeypatch
):
    """The end of a burst: requests acknowledged while the writer is busy with a group are
    not left for the next write; their data go in at once on the second connection, the
    chain rows after the running group's, in order: each stored once, the chain intact."""
    _overlapped(ingestor, bodies, monkeypatch, b_fails=False)
    assert ingestor.stats["overlapped_writes"] == 1
    assert ingestor.stats["writes"] == 2  # the held group, then the two followers as one
    _assert_stored_once(chdb_client, fresh_db, 3)
    assert ingestor.spool.backlog_bytes == 0


def test_many_requests_arriving_during_a_write_go_in_as_two_halves_at_once(
    chdb_client, fresh_db, ingestor, bodies, monkeypatch
):
    """Followers of _PAIR_MIN_SPANS or more (here 4 x 2,500 spans) are written as two
    groups at once, one on each extra connection, so that both cores write at the end of a
    burst; chain rows in order, each span stored once."""
    used = _overlapped(ingestor, bodies, monkeypatch, b_fails=False, followers=4)
    assert len(used) == 2 and used[0] is not used[1]  # the two halves, one per connection
    assert ingestor.stats["overlapped_writes"] == 1
    assert ingestor.stats["writes"] == 3  # the held group, then each half as its own group
    _assert_stored_once(chdb_client, fresh_db, 5)
    assert ingestor.spool.backlog_bytes == 0
    assert len(ingestor.spool.groups()) == 4  # both halves logged as groups of two


@pytest.mark.parametrize("followers", [2, 4], ids=["one-group", "two-halves"])
def test_a_failed_overlapped_write_is_written_again_the_usual_way(
    chdb_client, fresh_db, ingestor, bodies, monkeypatch, followers
):
    _overlapped(ingestor, bodies, monkeypatch, b_fails=True, followers=followers)
    assert ingestor.stats["overlapped_writes"] == 1
    _assert_stored_once(chdb_client, fresh_db, 1 + followers)
    assert ingestor.spool.backlog_bytes == 0


def test_past_the_memory_limit_requests_arriving_during_a_write_wait_for_it(
    chdb_client, fresh_db, ingestor, bodies, monkeypatch
):
    """Three writes at once are serve's memory peak: at overlap_max_rss (here any RSS) the
    followers stay queued while the running write holds, and go in after it (as two halves
    at once); each span stored once, the chain intact."""
    ingestor.overlap_max_rss = 1
    real = service.write_staged_data
    gate, entered = threading.Event(), threading.Event()
    during: list[Client] = []

    def held(client, *args, **kwargs):
        if client is ingestor.client and not gate.is_set():
            entered.set()
            assert gate.wait(60)
        elif not gate.is_set():
            during.append(client)
        return real(client, *args, **kwargs)

    monkeypatch.setattr(service, "write_staged_data", held)
    ingestor.submit(bodies[0], PROTOBUF, tenant="default")
    assert entered.wait(30)
    for body in bodies[1:5]:
        ingestor.submit(body, PROTOBUF, tenant="default")
    deadline = time.monotonic() + 30
    while ingestor.stats["overlaps_skipped_for_memory"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ingestor.stats["overlaps_skipped_for_memory"] >= 1
    assert ingestor.health()["queued"] == 4  # left on the queue, not taken
    gate.set()
    assert ingestor.wait_idle(60)
    assert during == [] and ingestor.stats["overlapped_writes"] == 0
    assert ingestor.stats["pair_writes"] == 1  # then the four as two halves at once
    _assert_stored_once(chdb_client, fresh_db, 5)
    assert ingestor.spool.backlog_bytes == 0


def test_the_writer_waits_for_a_request_still_being_received(ingestor, bodies):
    """A staged request is not written alone while another one's headers have arrived (the
    HTTP handler announces it): the two share one write (up to _STAGED_MAX_WAIT_S later)."""
    assert ingestor.stager is not None
    with ingestor.stager.incoming():  # as the HTTP handler does before reading a body
        ingestor.submit(bodies[0], PROTOBUF, tenant="default")
        time.sleep(0.1)
        ingestor.submit(bodies[1], PROTOBUF, tenant="default")
    assert ingestor.wait_idle(60)
    assert ingestor.stats["writes"] == 1 and ingestor.stats["batches"] == 2


def _purges(client) -> int:
    rows = client.query(
        "SELECT value FROM system.events WHERE event = 'MemoryAllocatorPurge'"
    ).result_rows
    return int(rows[0][0]) if rows else 0


def test_freed_memory_is_purged_when_quiet_at_most_every_interval(
    chdb_client, fresh_db, tmp_path, bodies, monkeypatch
):
    """SYSTEM JEMALLOC PURGE after a write only when no request is on its way and the last
    purge is _PURGE_EVERY_S old: not after every write, whose next write would fault the
    pages back in."""
    monkeypatch.setattr(service, "_PURGE_ABOVE_BYTES", 1 << 60)  # not this process's RSS
    ing = Ingestor(
        chdb_client, fresh_db, Spool(tmp_path / "spool", max_bytes=1 << 30), purge_memory=True
    )
    ing._purged_at -= service._PURGE_EVERY_S  # as if the last purge was long ago
    ing.start()
    try:
        before = _purges(chdb_client)
        ing.submit(bodies[0], PROTOBUF, tenant="default")
        assert ing.wait_idle(60)
        after_first = _purges(chdb_client)
        assert after_first >= before + 1  # quiet, and none for a while: purged
        purged_at = ing._purged_at
        ing.submit(bodies[1], PROTOBUF, tenant="default")
        assert ing.wait_idle(60)
        assert ing.stats["writes"] == 2
        assert ing._purged_at == purged_at  # the second write came within the interval
    finally:
        ing.stop()
    monkeypatch.setattr(service, "_PURGE_EVERY_S", 0.0)
    ing._purged_at = 0.0
    ing._staging = 1  # a request on its way: the writer does not purge
    ing._maybe_purge()
    assert ing._purged_at == 0.0
    # ... unless serve's RSS passed _PURGE_ABOVE_BYTES
    monkeypatch.setattr(service, "_PURGE_ABOVE_BYTES", 1 << 20)
    assert service._rss_bytes() > 1 << 20
    ing._maybe_purge()
    assert ing._purged_at > 0.0
    ing._purged_at = 0.0
    ing._staging = 0
    monkeypatch.setattr(service, "_PURGE_ABOVE_BYTES", 1 << 60)
    ing._maybe_purge()  # quiet: purged
    assert ing._purged_at > 0.0


def test_no_purges_under_load_when_the_engine_decays_promptly(
    chdb_client, fresh_db, tmp_path, monkeypatch
):
    """purge_under_load=False (serve with its own jemalloc decay in effect): past the RSS
    threshold with a request on its way, neither the writer nor the decoding hook purges;
    when quiet, the writer still does."""
    monkeypatch.setattr(service, "_PURGE_EVERY_S", 0.0)
    monkeypatch.setattr(service, "_PURGE_ABOVE_BYTES", 1 << 20)
    assert service._rss_bytes() > 1 << 20
    ing = Ingestor(
        chdb_client,
        fresh_db,
        Spool(tmp_path / "spool", max_bytes=1 << 30),
        purge_memory=True,
        purge_under_load=False,
    )
    ing._purged_at = 0.0
    ing._staging = 1  # under load
    before = _purges(chdb_client)
    ing._maybe_purge()
    ing._purge_if_big(chdb_client)
    assert ing._purged_at == 0.0 and _purges(chdb_client) == before
    ing._staging = 0  # quiet
    ing._maybe_purge()
    assert ing._purged_at > 0.0 and _purges(chdb_client) >= before + 1


def test_serve_purges_under_load_only_with_an_operators_allocator_options(monkeypatch):
    from ingest import _serve

    monkeypatch.setenv("JE_MALLOC_CONF", _serve.JEMALLOC_CONF)
    assert _serve._engine_decays_promptly()
    monkeypatch.setenv("JE_MALLOC_CONF", "dirty_decay_ms:5000")
    assert not _serve._engine_decays_promptly()
    monkeypatch.delenv("JE_MALLOC_CONF")
    assert not _serve._engine_decays_promptly()
