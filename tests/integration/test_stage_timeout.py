"""The chDB decoding path when its thread is stuck, and its one drop client, on real chDB.

A decoding thread held in `before_decode` (the Stager's public hook, called on the thread
before each decode) by an Event the test controls: stage() gives up after its bound with
StageTimeout, serve answers 503 (nothing spooled) and the sender's retry is stored once;
the request the thread stages late does not keep its staging table. The DROPs of the writer
and of request threads take turns on the drop client (watched through the `connect` factory
the Stager is built with).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from foundation.store import StoreSpec, connect
from ingest._service import Ingestor
from ingest._spool import Spool
from ingest.chdb import STAGE_DATABASE, Stager, StageTimeout
from ingest.testing import create_spans, request_protobuf

TENANT = "default"
SPANS = 50
PB = {"Content-Type": "application/x-protobuf"}


def _body(k: int) -> bytes:
    return request_protobuf(create_spans(k, SPANS, prefix="h-stuck"))


def _connector(chdb_path: Path) -> Callable[[], Any]:
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    return lambda: connect(spec, database="")


def _stage_tables(client) -> list[str]:
    rows = client.query(
        "SELECT name FROM system.tables WHERE database = {db:String}",
        parameters={"db": STAGE_DATABASE},
    ).result_rows
    return [r[0] for r in rows]


def test_a_stuck_decoding_thread_bounds_the_wait_and_keeps_no_table(
    chdb_client, chdb_path, tmp_path
):
    stager = Stager(_connector(chdb_path), tmp_path / "stage", stage_timeout_s=0.5)
    gate, entered = threading.Event(), threading.Event()

    def hold(_client) -> None:  # every decode waits for the gate while it is shut
        entered.set()
        gate.wait(60)

    stager.before_decode = hold
    stager.setup()
    try:
        body = _body(0)
        with pytest.raises(StageTimeout, match=r"did not answer within 0\.5 s"):
            stager.stage(body, batch_id="b0", received_at_ms=1, tenant=TENANT)
        assert entered.wait(30), "the thread never took the request"
        assert (stager.timeouts, stager.staged, stager.fallbacks) == (1, 0, 0)
        gate.set()  # the thread decodes and stages the request nobody waits for any more
        retry = stager.stage(body, batch_id="b0", received_at_ms=1, tenant=TENANT)
        assert retry is not None and retry.spans == SPANS
        stager.release([retry])  # (the writer's part once stored)
    finally:
        gate.set()
        stager.close()
    # the late Staged was released by the thread itself: every staging table went
    assert _stage_tables(chdb_client) == []


def test_serve_answers_503_not_200_and_the_retry_is_stored_once(
    chdb_client, chdb_path, fresh_db, tmp_path, serve_on
):
    stager = Stager(_connector(chdb_path), tmp_path / "stage", stage_timeout_s=0.5)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    ing = Ingestor(chdb_client, fresh_db, spool, stager=stager, sql_min_bytes=1)
    gate = threading.Event()

    def hold(_client: object) -> None:
        gate.wait(60)

    stager.before_decode = hold  # replaces the Ingestor's purge hook
    ing.start()
    try:
        url = serve_on(ing, max_body=1 << 24)
        body = _body(1)
        refused = requests.post(url, data=body, headers=PB, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        health = ing.health()
        assert health["sql_decode_timeouts"] == 1
        assert health["spool_backlog_bytes"] == 0 and health["spans"] == 0  # nothing accepted
        gate.set()
        stored = requests.post(url, data=body, headers=PB, timeout=30)  # the sender's retry
        assert stored.status_code == 200, stored.text
        assert ing.wait_idle(60)
        n = chdb_client.query(f"SELECT count(), uniqExact(SpanId) FROM {fresh_db}.otel_traces")
        assert n.result_rows == [(SPANS, SPANS)]
    finally:
        gate.set()
        ing.stop()
        stager.close()


class _Watched:
    """A real client whose `command` calls are watched: `overlaps` counts those entered while
    another ran on it. The first DROP TABLE of all clients sets `held` and waits for `gate`;
    a later one sets `entered`."""

    def __init__(self, client: Any, gate: threading.Event, held: threading.Event,
                 entered: threading.Event) -> None:  # fmt: skip
        self._client, self._gate, self._held, self._entered = client, gate, held, entered
        self._mu = threading.Lock()
        self._running = 0
        self.overlaps = 0

    def command(self, sql: str, *args: Any, **kw: Any) -> Any:
        with self._mu:
            self.overlaps += self._running > 0
            self._running += 1
        try:
            if sql.startswith("DROP TABLE"):
                if not self._held.is_set():
                    self._held.set()
                    self._gate.wait(60)
                else:
                    self._entered.set()
            return self._client.command(sql, *args, **kw)
        finally:
            with self._mu:
                self._running -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_drops_from_two_threads_take_turns_on_the_drop_client(chdb_client, chdb_path, tmp_path):
    real = _connector(chdb_path)
    gate, held, entered = threading.Event(), threading.Event(), threading.Event()
    clients: list[_Watched] = []

    def watched() -> Any:
        clients.append(_Watched(real(), gate, held, entered))
        return clients[-1]

    stager = Stager(watched, tmp_path / "stage")
    stager.setup()
    try:
        body = _body(2)
        # each copy of one batch id goes to a table of its own and closes the one before:
        # two closed tables, each kept for the request the writer has not released yet
        first, second, third = (
            stager.stage(body, batch_id="b2", received_at_ms=1, tenant=TENANT) for _ in range(3)
        )
        assert first and second and third and len({first.table, second.table, third.table}) == 3
        writer = threading.Thread(target=stager.release, args=([first],))
        writer.start()
        assert held.wait(30), "the first DROP never ran"
        other = threading.Thread(target=stager.release, args=([second],))
        other.start()
        # while the first DROP runs, the second must not start: given half a second to show
        # itself (without the lock it starts at once), it waits for the first to end
        assert not entered.wait(0.5)
        gate.set()
        for t in (writer, other):
            t.join(30)
        assert entered.is_set() and not (writer.is_alive() or other.is_alive())
        assert [c.overlaps for c in clients] == [0] * len(clients)
        assert _stage_tables(chdb_client) == [third.table.split(".", 1)[1]]
        stager.release([third])
    finally:
        gate.set()
        stager.close()
