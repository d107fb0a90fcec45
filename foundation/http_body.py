"""Request bodies on serve's HTTP ports (OTLP and queries): one reader for both.

`framing` decides from the headers alone (pure) how the body is delimited, as RFC 9112 §6
says: `Transfer-Encoding: chunked`, or one valid `Content-Length`, or no body. It refuses
with 400, before a byte is read, a Content-Length that is not a plain decimal number
(`-1`, `+5`, `0x10`, empty), two Content-Length values that differ, Content-Length together
with Transfer-Encoding (the classic request-smuggling pair), and any transfer coding but a
lone `chunked`.

`BodyReader` then reads at most `limit` bytes: `BodyError(413)` as soon as the limit is
passed (nothing past it is buffered), `BodyError(400)` when the body ends early or a chunk
is malformed. `drain` discards what is left of a refused body, bounded in bytes, so that a
keep-alive connection stays in step or is known to need closing. `gunzip` undoes a gzip
Content-Encoding under the same limit.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = ["BodyError", "BodyReader", "Framing", "Readable", "framing", "gunzip"]

_DECIMAL: Final = re.compile(r"[0-9]{1,18}")
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
_LINE_MAX: Final = 4096  # longest chunk-size line (with extensions) or trailer line, bytes
_TRAILERS_MAX: Final = 64  # most trailer lines after the last chunk
_READ_STEP: Final = 1 << 20


class Readable(Protocol):
    """What BodyReader reads from: a request handler's `rfile` (or a BytesIO in tests)."""

    def read(self, size: int, /) -> bytes: ...

    def readline(self, size: int, /) -> bytes: ...


class BodyError(Exception):
    """A body that cannot be taken: `status` is the HTTP status to answer (400, 411, 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Framing:
    """How one request body is delimited: chunked, or `length` bytes (0 when there is none).

    `declared` is False when the request had neither header (a POST without a body framing).
    """

    chunked: bool
    length: int
    declared: bool = True


def framing(content_lengths: Sequence[str], transfer_encodings: Sequence[str]) -> Framing:
    """The framing of a body from every `Content-Length` and `Transfer-Encoding` header value.

    Raises BodyError(400) for an invalid, conflicting or smuggling-prone combination.
    """
    codings = [c.strip().lower() for v in transfer_encodings for c in v.split(",")]
    lengths = [c.strip() for v in content_lengths for c in v.split(",")]
    if codings:
        if lengths:
            raise BodyError(400, "Content-Length and Transfer-Encoding together are not allowed")
        if codings != ["chunked"]:
            raise BodyError(
                400, f"unsupported Transfer-Encoding {', '.join(codings)!r}; only chunked"
            )
        return Framing(chunked=True, length=0)
    if not lengths:
        return Framing(chunked=False, length=0, declared=False)
    bad = [v for v in lengths if not _DECIMAL.fullmatch(v)]
    if bad:
        raise BodyError(400, f"bad Content-Length {bad[0]!r}: must be a decimal byte count")
    if len(set(map(int, lengths))) > 1:
        raise BodyError(400, f"conflicting Content-Length values {lengths}")
    return Framing(chunked=False, length=int(lengths[0]))


def request_framing(headers: Any) -> Framing:
    """`framing` of a request's headers (an `email.message.Message`, as http.server parses
    them: every value of a repeated header counts)."""
    return framing(
        headers.get_all("Content-Length") or [], headers.get_all("Transfer-Encoding") or []
    )


class BodyReader:
    """Reads one body off `rfile` as `framing` says; tracks what is left for `drain`."""

    def __init__(self, rfile: Readable, framing: Framing) -> None:
        self._rfile = rfile
        self._framing = framing
        self._left = 0 if framing.chunked else framing.length  # of the current chunk/body
        self._done = not framing.chunked and framing.length == 0
        self._broken = False  # framing lost: the connection cannot carry another request
        self._wire = 0  # bytes taken off rfile: data, chunk lines and trailers

    @property
    def in_step(self) -> bool:
        """The whole body was consumed and the connection may carry another request."""
        return self._done and not self._broken

    def read(self, limit: int) -> bytes:
        """The whole body; BodyError(413) once it passes `limit` bytes, (400) when cut short."""
        if not self._framing.chunked:
            n = self._framing.length
            if n > limit:
                raise BodyError(413, f"body of {n} bytes exceeds the limit of {limit} bytes")
            data = self._exact(n)
            self._left, self._done = 0, True
            return data
        out = bytearray()
        while True:
            size = self._chunk_size()
            if size == 0:
                self._trailers()
                self._done = True
                return bytes(out)
            if len(out) + size > limit:
                self._left = size
                raise BodyError(
                    413, f"chunked body exceeds the limit of {limit} bytes (at {len(out) + size})"
                )
            out += self._exact(size)
            self._chunk_end()

    def drain(self, max_bytes: int) -> bool:
        """Discard the rest of the body, at most about `max_bytes` of it (chunk lines and
        trailers count); True when all of it went (the connection is in step again), False
        when it must be closed. May be called again, with a new budget, after a False."""
        if self._broken:
            return False
        end = self._wire + max_bytes
        try:
            if not self._framing.chunked:
                if self._done:
                    return True
                if self._left > max_bytes:
                    return False
                self._skip(self._left)
                self._left, self._done = 0, True
                return True
            while not self._done:
                if self._left:
                    if self._wire + self._left > end:
                        return False
                    self._skip(self._left)
                    self._left = 0
                    self._chunk_end()
                if self._wire >= end:
                    return False
                size = self._chunk_size()
                if size == 0:
                    self._trailers()
                    self._done = True
                else:
                    self._left = size
            return True
        except BodyError:
            return False

    # ------------------------------------------------------------------ framing steps

    def _fail(self, message: str) -> BodyError:
        self._broken = True
        return BodyError(400, message)

    def _exact(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            chunk = self._rfile.read(min(n - got, _READ_STEP))
            if not chunk:
                raise self._fail(f"body truncated: got {got} of {n} bytes")
            parts.append(chunk)
            got += len(chunk)
        self._wire += n
        return b"".join(parts)

    def _skip(self, n: int) -> None:
        while n > 0:
            chunk = self._rfile.read(min(n, _READ_STEP))
            if not chunk:
                raise self._fail("body truncated")
            n -= len(chunk)
            self._wire += len(chunk)

    def _line(self) -> bytes:
        line = self._rfile.readline(_LINE_MAX + 1)
        self._wire += len(line)
        if not line:
            raise self._fail("chunked body truncated: the connection closed before its end")
        if not line.endswith(b"\n"):
            raise self._fail(f"malformed chunked body: a line longer than {_LINE_MAX} bytes")
        return line.rstrip(b"\r\n")

    def _chunk_size(self) -> int:
        line = self._line()
        size = line.split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size):
            raise self._fail(f"malformed chunked body: bad chunk size {size[:40]!r}")
        return int(size, 16)

    def _chunk_end(self) -> None:
        if self._line() != b"":
            raise self._fail("malformed chunked body: a chunk is longer than its size")

    def _trailers(self) -> None:
        for _ in range(_TRAILERS_MAX):
            if self._line() == b"":
                return
        raise self._fail(f"malformed chunked body: more than {_TRAILERS_MAX} trailer lines")


def gunzip(data: bytes, limit: int) -> bytes:
    """The decompressed gzip `data`, every member in turn (RFC 1952: a gzip body is one or
    more members, and what it holds is their output concatenated). Raises BodyError(413)
    once the output passes `limit` bytes, (400) for data that is not gzip, a truncated
    member, or bytes after a member that do not start another."""
    out = bytearray()
    rest = data
    member = 1
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))  # max_length >= 1: 0 means none
        except zlib.error as exc:
            what = "body is not valid gzip" if member == 1 else "bad data after a gzip member"
            raise BodyError(400, f"{what} (member {member}): {exc}") from None
        if len(out) > limit:
            raise BodyError(413, f"body exceeds {limit} bytes after gunzip")
        if not d.eof:
            raise BodyError(400, f"gzip body is truncated (member {member})")
        rest = d.unused_data
        if not rest:
            return bytes(out)
        member += 1
