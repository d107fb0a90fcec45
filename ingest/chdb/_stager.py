"""The Stager: chDB decodes OTLP/protobuf requests into Memory staging tables for the writer.

Python decoding costs ~40 µs of GIL-bound CPU per span (attribute loops, the row hash),
which caps serve far below the OTel Collector's own rate. On this path chDB parses each
request with the schema of ingest.chdb._schema and computes every stored column, the
wire-contract checks and the ledger row hash in SQL, in C++ (ingest.chdb._select).

The path is taken only for requests it provably stores exactly as the Python decoder
(ingest._decode) would: every span well formed, every attribute a string, int, bool or
array of strings (the wire types), no duplicate keys, no events or links, every handoff
transition complete, legal and claiming no other tenant. Anything else (a span to reject,
a transition to flag, a double, a map, bytes, a span event) goes through ingest._decode,
which gives the exact messages and flags. tests/integration/test_fast_path.py checks both
paths store identical rows, ledger hashes and batch hashes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ingest.chdb._framing import frame_parts
from ingest.chdb._native import summarize
from ingest.chdb._schema import (
    LEAN,
    STAGE_DATABASE,
    STAGE_DDL,
    STREAM_COLUMNS,
    inline_settings,
    sql_string,
)
from ingest.chdb._select import stream_select
from ingest.chdb._stream import (
    Chunk,
    Stream,
    StreamBroken,
    UnsupportedClient,
    check_client_version,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["Staged", "Stager"]

_log = logging.getLogger(__name__)
_STAGE_THREADS: Final = 2  # decoding streams, one per core; the writer runs alongside
_GLOB_CHARS: Final = frozenset("*?{}")
_STAGE_REQUESTS: Final = 2  # requests a stream stages into one table before a new one
_MAX_START_FAILURES: Final = 3


@dataclass(frozen=True, slots=True)
class Staged:
    """A request chDB decoded into a staging table (shared with other requests the same
    stream decoded), waiting for the writer."""

    table: str  # STAGE_DATABASE.<name>
    batch_id: str
    spans: int
    transitions: int
    batch_hash: str  # integrity.batch_hash of its ledger row hashes


class _Pending:
    __slots__ = ("batch_id", "body", "done", "received_at_ms", "result", "tenant")

    def __init__(self, body: bytes, batch_id: str, received_at_ms: int, tenant: str) -> None:
        self.body = body
        self.batch_id = batch_id
        self.received_at_ms = received_at_ms
        self.tenant = tenant
        self.done = threading.Event()
        self.result: Staged | None = None


class Stager:
    """Decodes protobuf requests with chDB (see module doc) into Memory staging tables.

    Each of two threads (one per core; the writer runs alongside) keeps one decoding query
    running for the life of serve (Stream): ClickHouse spends ~50 ms parsing, analysing and
    planning that query, paid once instead of for every request or group of requests (a query
    per group would be 11 such queries per 100,000 spans, and closed-loop senders would wait
    for each other to share one). A request is framed into the thread's FIFO as soon as the thread
    is free; its rows come back as Native blocks, the thread reads the ack's figures (ok,
    span and transition counts, batch hash) from them and stages them with an INSERT ...
    FORMAT Native into the stream's current Memory table. A request whose query fails
    (malformed protobuf) goes the Python way; the thread starts a new stream. `connect`
    opens a new clickhouse-connect client on the same embedded store; `tmp_dir` holds the
    FIFOs and each block file while chDB reads it; `stream_query` builds each stream's
    query from its FIFO's path (ingest.chdb._select.stream_select).
    """

    def __init__(
        self,
        connect: Callable[[], Client],
        tmp_dir: Path,
        *,
        stream_query: Callable[[str], str] = stream_select,
    ) -> None:
        self._connect = connect
        self._stream_query = stream_query
        self.tmp_dir = tmp_dir
        self._own_dir: Path | None = None  # see setup()
        self._clients: list[Client] = []
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._refs: dict[str, int] = {}  # staging table -> requests the writer still needs
        self._open: set[str] = set()  # staging tables a stream still stages into
        self._n = itertools.count()
        self._threads: list[threading.Thread] = []
        self._incoming = 0  # requests being received (see incoming())
        self._drop_client: Client | None = None
        self.fallbacks = 0  # requests this path declined (went through ingest._decode)
        self.staged = 0  # requests it decoded
        self.queries = 0  # decoding streams started (one per thread unless a request broke one)
        self._start_failures = 0  # streams whose query failed before reading (see _run)
        self.disabled = False  # after _MAX_START_FAILURES of those: every request goes Python
        #: called with the thread's client before each decode (serve: Ingestor._purge_if_big)
        self.before_decode: Callable[[Client], None] | None = None

    def setup(self) -> None:
        """(Re)create the staging database, empty; start the decoding threads."""
        if _GLOB_CHARS.intersection(str(self.tmp_dir)) and self._own_dir is None:
            # ClickHouse's file() reads * ? { } in a path as a glob, even in a directory name:
            # such a directory would make every decoding query fail (and every request go
            # the Python way); the FIFOs go to a private temporary directory instead
            self._own_dir = Path(tempfile.mkdtemp(prefix="handoffs-stage-"))
            self.tmp_dir = self._own_dir
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for pattern in ("*.pb", "*.fifo", "*.native"):
            for f in self.tmp_dir.glob(pattern):
                f.unlink(missing_ok=True)
        admin = self._connect_once()
        admin.command(f"DROP DATABASE IF EXISTS {STAGE_DATABASE}")
        admin.command(f"CREATE DATABASE {STAGE_DATABASE} ENGINE = Memory")
        try:
            check_client_version()
        except UnsupportedClient as e:  # every request goes the Python way, said once
            self.disabled = True
            _log.warning("chDB decoding disabled (Python decodes): %s", e)
            return
        while len(self._threads) < _STAGE_THREADS:
            slot = len(self._threads)
            t = threading.Thread(target=self._run, args=(slot,), name="ingest-stager", daemon=True)
            self._threads.append(t)
            t.start()

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Around receiving, spooling and staging a request that will likely come this way
        (the writer waits for such requests before a write, see Ingestor._on_the_way)."""
        with self._lock:
            self._incoming += 1
        try:
            yield
        finally:
            with self._lock:
                self._incoming -= 1

    def receiving(self) -> bool:
        """A request announced by incoming() is being received or decoded."""
        return self._incoming > 0

    def stage(
        self,
        body: bytes,
        *,
        batch_id: str,
        received_at_ms: int,
        tenant: str,
    ) -> Staged | None:
        """Decode `body` into a staging table; None when the request must go the Python way
        (a span to reject or flag, a value type this path does not encode, bad framing)."""
        if not self._threads:
            return None
        if self.disabled:
            with self._lock:
                self.fallbacks += 1
            return None
        p = _Pending(body, batch_id, received_at_ms, tenant)
        self._queue.put(p)
        p.done.wait()
        with self._lock:
            if p.result is None:
                self.fallbacks += 1
            else:
                self.staged += 1
        return p.result

    def _start(self, slot: int) -> Stream:
        client = self._connect()
        with self._lock:
            self._clients.append(client)
            self.queries += 1
        return Stream(
            client, self.tmp_dir / f"s{slot}-{next(self._n)}.fifo", query=self._stream_query
        )

    def _run(self, slot: int) -> None:
        cmd = self._connect()
        with self._lock:
            self._clients.append(cmd)
        stream: Stream | None = self._start(slot)
        table, used = "", _STAGE_REQUESTS
        batches: set[str] = set()  # the requests staged in `table`
        try:
            while True:
                p = self._queue.get()
                if p is None:
                    return
                if stream is None:  # disabled: declined (it was queued before)
                    p.done.set()
                    continue
                if self.before_decode is not None:
                    with contextlib.suppress(Exception):
                        self.before_decode(cmd)
                try:
                    blocks = stream.decode(
                        frame_parts(p.body, p.batch_id, p.received_at_ms, p.tenant)
                    )
                except StreamBroken as e:
                    # the Python decoder takes this request (and says what is wrong)
                    self._retire_stream(stream)
                    stream = None
                    if not e.started:  # the query itself fails, not a request
                        self._start_failures += 1
                        if self._start_failures >= _MAX_START_FAILURES and not self.disabled:
                            self.disabled = True
                            _log.warning("chDB decoding disabled (Python decodes): %s", e)
                    if not self.disabled:
                        stream = self._start(slot)
                    p.done.set()
                    continue
                try:
                    spans, ok, transitions, bh = summarize((b.view for b in blocks), p.batch_id)
                    if spans and ok:
                        if used >= _STAGE_REQUESTS or p.batch_id in batches:
                            # a retried copy of the request staged here goes to a table
                            # of its own: the writer selects a request's rows by batch id,
                            # and may be reading this table while the copy comes in
                            self._close_table(table)
                            table, used, batches = self._new_table(cmd), 0, set()
                        used += 1
                        batches.add(p.batch_id)
                        self._insert(cmd, table, blocks)
                        with self._lock:
                            self._refs[table] += 1
                        p.result = Staged(table, p.batch_id, spans, transitions, bh)
                        if used >= _STAGE_REQUESTS:  # full: it goes once the writer has it
                            self._close_table(table)
                            table = ""
                except Exception:
                    p.result = None
                p.done.set()
                del blocks, p  # megabytes, not kept while the thread waits for a request
        finally:
            self._close_table(table)
            if stream is not None:
                stream.close()

    def _retire_stream(self, stream: Stream) -> None:
        threading.Thread(target=stream.close, name="ingest-stream-end", daemon=True).start()

    def _new_table(self, c: Client) -> str:
        table = f"{STAGE_DATABASE}.g{next(self._n)}"
        c.command(f"CREATE TABLE {table} ({STAGE_DDL}) ENGINE = Memory")
        with self._lock:
            self._refs[table] = 0
            self._open.add(table)
        return table

    def _close_table(self, table: str) -> None:
        """A stream stages no more into `table`: it goes once the writer has all of it."""
        if not table:
            return
        with self._lock:
            self._open.discard(table)
            gone = self._refs.get(table, 0) <= 0
            if gone:
                self._refs.pop(table, None)
        if gone:
            self._connect_once().command(f"DROP TABLE IF EXISTS {table}")

    def _insert(self, c: Client, table: str, blocks: list[Chunk]) -> None:
        path = self.tmp_dir / f"{table.rsplit('.', 1)[1]}-{next(self._n)}.native"
        with open(path, "wb") as f:
            f.writelines(b.view for b in blocks)
        try:
            c.command(
                f"INSERT INTO {table} ({', '.join(STREAM_COLUMNS)}) "
                f"FROM INFILE {sql_string(str(path))} SETTINGS {inline_settings(LEAN)} "
                "FORMAT Native"
            )
        finally:
            path.unlink(missing_ok=True)

    def release(self, staged: Iterable[Staged]) -> None:
        """The writer is done with these requests; a staging table goes when all of its are
        and its stream has moved on to another."""
        gone = []
        with self._lock:
            for s in staged:
                left = self._refs.get(s.table, 0) - 1
                if left <= 0 and s.table not in self._open:
                    self._refs.pop(s.table, None)
                    gone.append(s.table)
                elif s.table in self._refs:
                    self._refs[s.table] = max(left, 0)
        if gone:
            c = self._connect_once()
            for t in gone:
                c.command(f"DROP TABLE IF EXISTS {t}")

    def new_client(self) -> Client:
        """Another connection to the same store (the caller closes it)."""
        return self._connect()

    def _connect_once(self) -> Client:
        # DROPs run on the caller's thread (the writer): a client of their own, opened once
        with self._lock:
            if self._drop_client is None:
                self._drop_client = self._connect()
            return self._drop_client

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(30)
        self._threads.clear()
        for c in [*self._clients, self._drop_client]:
            if c is not None:
                c.close()
        self._clients.clear()
        self._drop_client = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
