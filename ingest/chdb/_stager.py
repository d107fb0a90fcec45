"""The Stager: chDB decodes OTLP/protobuf requests into Memory staging tables for the writer.

Python decoding costs ~40 µs of GIL-bound CPU per span (attribute loops, the row hash),
which caps serve far below the OTel Collector's own rate. On this path chDB parses each
request with the schema of ingest.chdb._schema and computes every stored column, the
wire-contract checks and the ledger row hash in SQL, in C++ (ingest.chdb._select).

The path is taken only for requests it provably stores exactly as the Python decoder
(ingest._decode) would: every span well formed, every attribute a string, int, bool or
array of strings and ints (the wire types: string[] and int[] attributes with items of
their type, ingest._validate.ITEM_TAG), no duplicate keys, no events or links, every handoff
transition complete, legal and claiming no other tenant. Anything else (a span to reject,
a transition to flag, a double, a map, bytes, a span event) goes through ingest._decode,
which gives the exact messages and flags. tests/integration/test_fast_path.py (and
test_fast_path_arrays.py, for int[] and mixed arrays) checks both
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

from foundation.store import StoreUnavailable
from ingest.chdb._framing import frame_parts, span_count
from ingest.chdb._native import block_batch, summarize
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

__all__ = ["STAGE_STREAMS", "STAGE_TIMEOUT_S", "StageTimeout", "Staged", "Stager"]

_log = logging.getLogger(__name__)
#: decoding streams (threads, each with its query). One: the round trip is shared by more
#: requests (SDK batches of 512 spans from 8 senders: ~3.9 per round, against ~2.1 each with
#: two streams), the same throughput on 2 cores and one query's buffers less (bench/RESULTS.md)
STAGE_STREAMS: Final = 1
_GLOB_CHARS: Final = frozenset("*?{}")
#: spans a stream stages into one table before a new one (two 5,000-span requests, sixteen
#: SDK batches of 512: the writer reads each table of a write with a subquery of its own)
_STAGE_SPANS: Final = 8192
#: a decoding round (one stream round trip, one INSERT): at most this many requests queued
#: together, or this many bytes of them; each round pays ~6 ms of fixed work (the round trip
#: ~3.5 ms, the INSERT ~3 ms), as much as decoding 512 spans
_ROUND_REQUESTS: Final = 8
_ROUND_BYTES: Final = 4 << 20
_MAX_START_FAILURES: Final = 3
#: seconds stage() waits for a decoding thread (a round takes milliseconds; the OTLP
#: exporters' own timeout is 10 s): past it the thread is stuck, and the request is refused
STAGE_TIMEOUT_S: Final = 30.0


class StageTimeout(StoreUnavailable):
    """No decoding thread answered within the stage timeout. Nothing was spooled, so serve
    answers 503 (a StoreUnavailable) and the sender retries: the request is not lost."""


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
    __slots__ = ("abandoned", "batch_id", "body", "done", "received_at_ms", "result", "spans",
                 "tenant")  # fmt: skip

    def __init__(self, body: bytes, batch_id: str, received_at_ms: int, tenant: str) -> None:
        self.body = body
        self.batch_id = batch_id
        self.received_at_ms = received_at_ms
        self.tenant = tenant
        self.done = threading.Event()
        self.result: Staged | None = None
        self.spans: int | None = None  # framing.span_count of body, once taken
        self.abandoned = False  # stage() stopped waiting (its timeout); set under Stager._lock


class _Table:
    """The staging table a stream currently stages into ('' for none yet)."""

    __slots__ = ("batches", "name", "spans")

    def __init__(self) -> None:
        self.name = ""
        self.spans = _STAGE_SPANS  # spans staged in it (full: the next round opens one)
        self.batches: set[str] = set()  # their batch ids


class Stager:
    """Decodes protobuf requests with chDB (see module doc) into Memory staging tables.

    Each of `streams` threads (STAGE_STREAMS by default) keeps one decoding query
    running for the life of serve (Stream): ClickHouse spends ~50 ms parsing, analysing and
    planning that query, paid once instead of for every request or group of requests (a query
    per group would be 11 such queries per 100,000 spans, and closed-loop senders would wait
    for each other to share one). When a thread is free it takes every request queued at that
    moment (a round: up to _ROUND_REQUESTS or _ROUND_BYTES) and frames them into its FIFO
    together; their rows come back as Native blocks, each of one request, the thread reads each
    request's ack figures (ok, span and transition counts, batch hash) from its blocks and
    stages the round's ok requests with one INSERT ... FORMAT Native into the stream's current
    Memory table (the round trip and the INSERT cost ~6 ms together whatever the size: paid
    once per round, not per 512-span SDK batch). A round whose query fails (malformed protobuf)
    goes the Python way, every request of it; the thread starts a new stream. `connect`
    opens a new clickhouse-connect client on the same embedded store; `tmp_dir` holds the
    FIFOs and each block file while chDB reads it; `stream_query` builds each stream's
    query from its FIFO's path (ingest.chdb._select.stream_select); `stage_timeout_s` bounds
    each stage() call's wait for its request's decode (StageTimeout past it).
    """

    def __init__(
        self,
        connect: Callable[[], Client],
        tmp_dir: Path,
        *,
        stream_query: Callable[[str], str] = stream_select,
        streams: int = STAGE_STREAMS,
        stage_timeout_s: float = STAGE_TIMEOUT_S,
    ) -> None:
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        if not stage_timeout_s > 0:
            raise ValueError(f"stage_timeout_s must be > 0 seconds, got {stage_timeout_s}")
        self.streams = streams
        self.stage_timeout_s = stage_timeout_s
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
        # The DROPs' one client (opened on first use) serves the writer and request threads
        # (release), the decoding threads (_close_table, _finish) and setup/close, and runs one
        # query at a time: they take turns on _drop_lock. Not _lock: no DROP holds up the
        # counters and references that request threads take _lock for.
        self._drop_lock = threading.Lock()
        self._drop_client: Client | None = None
        self.fallbacks = 0  # requests this path declined (went through ingest._decode)
        self.staged = 0  # requests it decoded
        self.rounds = 0  # stream round trips (each decodes one or several queued requests)
        self.queries = 0  # decoding streams started (one per thread unless a request broke one)
        self._start_failures = 0  # streams whose query failed before reading (see _run)
        self.disabled = False  # after _MAX_START_FAILURES of those: every request goes Python
        self.timeouts = 0  # stage() calls refused with StageTimeout
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
        self._drop(
            f"DROP DATABASE IF EXISTS {STAGE_DATABASE}",
            f"CREATE DATABASE {STAGE_DATABASE} ENGINE = Memory",
        )
        try:
            check_client_version()
        except UnsupportedClient as e:  # every request goes the Python way, said once
            self.disabled = True
            _log.warning("chDB decoding disabled (Python decodes): %s", e)
            return
        while len(self._threads) < self.streams:
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

    def announced(self) -> int:
        """How many requests announced by incoming() are being received or decoded now."""
        return self._incoming

    def waiting(self) -> int:
        """Requests queued for a decoding stream, not yet taken (approximate)."""
        return self._queue.qsize()

    def stage(
        self,
        body: bytes,
        *,
        batch_id: str,
        received_at_ms: int,
        tenant: str,
    ) -> Staged | None:
        """Decode `body` into a staging table; None when the request must go the Python way
        (a span to reject or flag, a value type this path does not encode, bad framing).
        Raises StageTimeout when no decoding thread answered within stage_timeout_s."""
        if not self._threads:
            return None
        if self.disabled:
            with self._lock:
                self.fallbacks += 1
            return None
        p = _Pending(body, batch_id, received_at_ms, tenant)
        self._queue.put(p)
        if not p.done.wait(self.stage_timeout_s):
            with self._lock:  # _finish sets done under it: decoded now, or abandoned for good
                if not p.done.is_set():
                    p.abandoned = True
                    self.timeouts += 1
                    raise StageTimeout(
                        f"chDB decoding did not answer within {self.stage_timeout_s:g} s; "
                        "nothing was stored, retry later"
                    )
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

    def _take(self, first: _Pending) -> tuple[list[_Pending], _Pending | None, bool]:
        """`first` and the requests queued behind it at this moment, up to _ROUND_REQUESTS
        or _ROUND_BYTES: (the round, a request held for the next round, whether close() was
        asked). A second request of a batch id already in the round waits for the next one:
        the writer selects a request's rows by batch id."""
        group, size, ids = [first], len(first.body), {first.batch_id}
        while len(group) < _ROUND_REQUESTS and size < _ROUND_BYTES:
            try:
                p = self._queue.get_nowait()
            except queue.Empty:
                break
            if p is None:
                return group, None, True
            if p.batch_id in ids:
                return group, p, False
            group.append(p)
            ids.add(p.batch_id)
            size += len(p.body)
        return group, None, False

    def _run(self, slot: int) -> None:
        cmd = self._connect()
        with self._lock:
            self._clients.append(cmd)
        stream: Stream | None = self._start(slot)
        table = _Table()
        held: _Pending | None = None  # taken from the queue, decoded in the next round
        stop = False
        try:
            while not stop:
                first = held if held is not None else self._queue.get()
                if first is None:
                    return
                group, held, stop = self._take(first)
                for p in group:
                    p.spans = span_count(p.body)
                    if not p.spans:  # no spans, or a body that does not parse: the Python way
                        p.done.set()
                group = [p for p in group if p.spans]
                if stream is None or not group:  # disabled: declined (queued before)
                    for p in group:
                        p.done.set()
                    continue
                if self.before_decode is not None:
                    with contextlib.suppress(Exception):
                        self.before_decode(cmd)
                with self._lock:
                    self.rounds += 1
                try:
                    # one round trip for the whole round: each request is its own record,
                    # and its blocks carry its batch id (one input record per block)
                    blocks = stream.decode(
                        [
                            part
                            for p in group
                            for part in frame_parts(p.body, p.batch_id, p.received_at_ms, p.tenant)
                        ],
                        sum(p.spans or 0 for p in group),
                    )
                except StreamBroken as e:
                    # the Python decoder takes these requests (and says what is wrong)
                    self._retire_stream(stream)
                    stream = None
                    if not e.started:  # the query itself fails, not a request
                        self._start_failures += 1
                        if self._start_failures >= _MAX_START_FAILURES and not self.disabled:
                            self.disabled = True
                            _log.warning("chDB decoding disabled (Python decodes): %s", e)
                    if not self.disabled:
                        stream = self._start(slot)
                    for p in group:
                        p.done.set()
                    continue
                try:
                    self._stage_round(cmd, group, blocks, table)
                except Exception:
                    for p in group:
                        p.result = None
                self._finish(group)
                # megabytes, not kept while the thread waits for a request
                del blocks, group, first, p
        finally:
            self._close_table(table.name)
            if stream is not None:
                stream.close()

    def _stage_round(
        self,
        cmd: Client,
        group: list[_Pending],
        blocks: list[Chunk],
        table: _Table,
    ) -> None:
        """Stage the ok requests of a decoded round into the stream's `table` with one
        INSERT and set their results (the others' stay None: they go the Python way)."""
        by_batch: dict[str, list[Chunk]] = {p.batch_id: [] for p in group}
        for b in blocks:
            batch_id = block_batch(b.view)[0]
            if batch_id not in by_batch:
                raise ValueError(f"Native block of a request not in this round: {batch_id!r}")
            by_batch[batch_id].append(b)
        ok_group: list[tuple[_Pending, int, int, str]] = []
        for p in group:
            try:
                spans, ok, transitions, bh = summarize(
                    (b.view for b in by_batch[p.batch_id]), p.batch_id
                )
            except ValueError:
                continue
            if spans and ok and spans == p.spans:
                ok_group.append((p, spans, transitions, bh))
        if not ok_group:
            return
        if table.spans >= _STAGE_SPANS or any(p.batch_id in table.batches for p, *_ in ok_group):
            # a retried copy of a request staged here goes to another table: the writer
            # selects a request's rows by batch id, and may be reading this table while
            # the copy comes in
            self._close_table(table.name)
            table.name, table.spans, table.batches = self._new_table(cmd), 0, set()
        self._insert(cmd, table.name, [b for p, *_ in ok_group for b in by_batch[p.batch_id]])
        table.spans += sum(spans for _, spans, _, _ in ok_group)
        table.batches.update(p.batch_id for p, *_ in ok_group)
        with self._lock:
            self._refs[table.name] += len(ok_group)
        for p, spans, transitions, bh in ok_group:
            p.result = Staged(table.name, p.batch_id, spans, transitions, bh)
        if table.spans >= _STAGE_SPANS:  # full: it goes once the writer has its requests
            self._close_table(table.name)
            table.name = ""

    def _finish(self, group: list[_Pending]) -> None:
        """Wake the round's callers. One whose stage() gave up (its timeout) never hands its
        Staged to the writer: released here, or its staging table would be kept for good."""
        with self._lock:
            for p in group:
                p.done.set()
            late = [p.result for p in group if p.abandoned and p.result is not None]
        if late:
            self.release(late)

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
            self._drop(f"DROP TABLE IF EXISTS {table}")

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
            self._drop(*(f"DROP TABLE IF EXISTS {t}" for t in gone))

    def new_client(self) -> Client:
        """Another connection to the same store (the caller closes it)."""
        return self._connect()

    def _drop(self, *commands: str) -> None:
        """Run `commands` on the drop client, one caller at a time (see _drop_lock)."""
        with self._drop_lock:
            if self._drop_client is None:
                self._drop_client = self._connect()
            for c in commands:
                self._drop_client.command(c)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(30)
        self._threads.clear()
        for c in self._clients:
            c.close()
        self._clients.clear()
        with self._drop_lock:  # a writer's release still running finishes first
            if self._drop_client is not None:
                self._drop_client.close()
            self._drop_client = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
