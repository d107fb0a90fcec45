"""One long-lived chDB decoding query fed through a FIFO, and the one place that reaches
into clickhouse-connect's internals.

clickhouse-connect's chdb backend returns a raw stream whose `read()` joins every result
chunk into one bytes object; this module takes the engine's chunks one by one instead (the
stream's private `_sr`, chDB's StreamingResult: one chunk per Native block, read in place
through `get_memview()`), so a request's blocks are seen as soon as they are ready and
never copied. That attribute is not a public API: SUPPORTED names the clickhouse-connect
releases it was checked against (pyproject pins the same), and a stream refuses to start
under any other (`UnsupportedClient`, a clear message; the stager then decodes in Python).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ingest.chdb._framing import MARKER, MARKER_ID
from ingest.chdb._native import block_batch
from ingest.chdb._select import stream_select

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "DECODE_TIMEOUT_S",
    "MARKER_GRACE_S",
    "SUPPORTED",
    "Chunk",
    "Stream",
    "StreamBroken",
    "UnsupportedClient",
    "check_client_version",
]

#: clickhouse-connect releases (major.minor) whose chdb raw stream has the `_sr` this
#: module reads
SUPPORTED: Final = ("1.12",)
DECODE_TIMEOUT_S: Final = 120.0  # a request's answer from its stream (~10 µs per span)
MARKER_GRACE_S: Final = 5.0  # after the end marker's block, for the blocks still in flight


class UnsupportedClient(RuntimeError):
    """The installed clickhouse-connect is not one this module was checked against."""


class StreamBroken(Exception):
    """A decoding stream's query ended or did not answer (the request goes the Python way
    and the stager starts a new stream). `started`: whether the query had begun reading."""

    def __init__(self, message: str, *, started: bool = True) -> None:
        super().__init__(message)
        self.started = started


def check_client_version(version: str | None = None) -> None:
    """Raise UnsupportedClient unless clickhouse-connect `version` (default: the installed
    one, read from its package metadata without importing it) is in SUPPORTED."""
    if version is None:
        version = metadata.version("clickhouse-connect")
    if ".".join(version.split(".")[:2]) not in SUPPORTED:
        raise UnsupportedClient(
            f"chDB decoding reads clickhouse-connect's chdb stream internals, checked against "
            f"{', '.join(SUPPORTED)}.x; clickhouse-connect {version} is installed "
            "(install a supported one: pyproject.toml pins it)"
        )


@functools.cache
def _check_installed() -> None:
    check_client_version()


class Chunk:
    """One Native block a decoding stream returned, read in place (no copy into Python):
    `view` is valid only while this object lives, so it is kept with its block."""

    __slots__ = ("_result", "view")

    def __init__(self, result: Any) -> None:
        self._result = result  # chDB's result chunk: owns the memory behind `view`
        self.view = memoryview(result.get_memview().view())


class Stream:
    """One long-lived decoding query (stream_select): framed requests go into a FIFO, each
    comes back as Native blocks of its staged rows. A thread of its own pulls the blocks."""

    def __init__(
        self, client: Client, path: Path, *, query: Callable[[str], str] = stream_select
    ) -> None:
        """Start the query `query(fifo path)` reading `path` (a FIFO made here). Raises
        UnsupportedClient under a clickhouse-connect this module was not checked against."""
        _check_installed()
        self.client = client
        self.path = path
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        self._out: queue.SimpleQueue[Chunk | BaseException | None] = queue.SimpleQueue()
        self._fd = -1
        self._reader = threading.Thread(
            target=self._read, args=(query(str(path)),), name="ingest-stream", daemon=True
        )
        self._reader.start()

    def _read(self, query: str) -> None:
        try:
            stream: Any = self.client.raw_stream(query, fmt="Native")
            # clickhouse-connect's chdb backend (pinned in pyproject.toml): the engine's
            # result chunks, one per block; raw_stream's read() joins them. Without it
            # (another version) the stream fails to start and the Python decoder takes over.
            chunks = stream._sr
            try:
                for chunk in chunks:
                    if chunk.size():
                        self._out.put(Chunk(chunk))
                    # not kept alive while the query waits for the next request (megabytes)
                    del chunk
            finally:
                stream.close()
            self._out.put(None)
        except BaseException as e:
            self._out.put(e)

    def _open(self, deadline: float) -> None:
        # chDB opens the FIFO for reading once the query runs; until then a non-blocking
        # open for writing fails (ENXIO). Blocking would hang if the query failed first.
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise StreamBroken(f"decoding stream did not start: {e}", started=False) from e
                if not self._reader.is_alive() or not self._out.empty():
                    err = self._out.get() if not self._out.empty() else None
                    raise StreamBroken(
                        f"decoding stream ended before it read: {err}", started=False
                    ) from e
                time.sleep(0.001)
        os.set_blocking(fd, True)
        self._fd = fd

    def decode(
        self, record: list[bytes], rows: int, timeout: float = DECODE_TIMEOUT_S
    ) -> list[Chunk]:
        """The Native blocks of the framed requests in `record` (frame_parts, one or several
        records one after another), `rows` rows in all (their spans: framing.span_count);
        each block holds rows of one request (block_batch), and a request of no spans has
        none. The query processes blocks on two threads, so the end marker's block may come
        before a request's last ones: they are waited for (StreamBroken if they do not come
        within MARKER_GRACE_S of it, or if more come)."""
        deadline = time.monotonic() + timeout
        if self._fd < 0:
            self._open(deadline)
        views = [memoryview(b) for b in (*record, MARKER) if b]
        try:
            while views:
                n = os.writev(self._fd, views)
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if n:
                    views[0] = views[0][n:]
        except OSError as e:  # EPIPE: the query ended (bad input) and closed the FIFO
            raise StreamBroken(str(e)) from e
        blocks: list[Chunk] = []
        seen, ended = 0, False
        while True:
            try:
                item = self._out.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise StreamBroken(
                    f"no answer from the decoding stream in {timeout:.0f} s"
                ) from None
            if item is None or isinstance(item, BaseException):
                raise StreamBroken(str(item or "decoding stream ended")) from (
                    item if isinstance(item, BaseException) else None
                )
            batch_id, n = block_batch(item.view)
            if batch_id == MARKER_ID:
                ended = True
                deadline = min(deadline, time.monotonic() + MARKER_GRACE_S)
            else:
                blocks.append(item)
                seen += n
            if seen > rows:
                raise StreamBroken(f"decoding stream returned {seen} rows, {rows} expected")
            if ended and seen == rows:
                return blocks

    def close(self) -> None:
        """End the query (EOF on its FIFO) and wait for it."""
        if self._fd < 0:
            with contextlib.suppress(StreamBroken):
                self._open(time.monotonic() + 5)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._reader.join(30)
        self.path.unlink(missing_ok=True)
