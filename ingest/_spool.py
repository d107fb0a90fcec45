"""Append-only, fsynced spool of accepted OTLP requests: serve's durability before the 200.

Records are framed `MAGIC | header_len | body_len | crc32 | header JSON | body` in numbered
segment files. `append` returns once the record is on disk (fdatasync, group commit: one
sync covers every record written before it, so concurrent requests share syncs). A failed
write (disk full) removes its partial frame before raising. On open, bytes that are not a
valid frame (a torn tail from a crash, never acknowledged; or on-disk corruption) are
skipped by resyncing on the next valid frame, copied to `quarantine-*.bad` and reported.
`commit(*seqs)` marks records stored (the checkpoint: every record up to it is stored);
segments wholly committed are deleted.
One process at a time: the directory's `lock` file is locked (POSIX record lock) while a
Spool is open, and a second process opening it gets SpoolLocked at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["Spool", "SpoolClosed", "SpoolFull", "SpoolLocked", "SpoolRecord"]

log = logging.getLogger("handoffs.spool")
_MAGIC: Final = b"HOS1"
_FRAME: Final = struct.Struct(">4sIII")
_SEGMENT_BYTES: Final = 64 * 1024 * 1024


class SpoolFull(RuntimeError):
    """The spool holds SPOOL_MAX_BYTES of records not yet stored: the store is behind."""


class SpoolClosed(OSError):
    """append() after close(): nothing was written. An OSError, as a failed spool write is,
    so the receivers answer 503 and the sender retries (this serve after its restart, or
    another); writing on would hit a closed file descriptor, or a file that reused its number."""


class SpoolLocked(RuntimeError):
    """Another process has this spool directory open (another serve on the same spool)."""


def _lock_directory(directory: Path) -> int:
    """An fd holding an exclusive lock on `directory/lock` (with our pid in it).

    A POSIX record lock (lockf): held per process, so it is released by the kernel when the
    process dies however it dies, and a crash leaves nothing to clean up. Raises SpoolLocked
    when another process holds it.
    """
    import fcntl

    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise SpoolLocked(
            f"the spool directory {directory} is in use by another process (pid {holder}; "
            "another serve?): stop it first or give this one its own --spool-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    seq: int
    header: dict[str, Any]
    body: bytes


def _parse_frame(data: bytes, pos: int) -> tuple[SpoolRecord, int, int] | None:
    """The record whose frame starts at `pos`, with its (start, end), or None if it is bad."""
    if pos + _FRAME.size > len(data):
        return None
    magic, hlen, blen, crc = _FRAME.unpack_from(data, pos)
    start = pos + _FRAME.size
    end = start + hlen + blen
    if magic != _MAGIC or end > len(data):
        return None
    payload = data[start:end]
    if zlib.crc32(payload) != crc:
        return None
    try:
        header = json.loads(payload[:hlen])
        seq = int(header["seq"])
    except (ValueError, KeyError, TypeError):
        return None
    return SpoolRecord(seq, header, bytes(payload[hlen:])), pos, end


def _seg_name(n: int) -> str:
    return f"seg-{n:010d}.log"


class Spool:
    """A directory of spool segments. Thread-safe. `fsync=False` only for benchmarks' baselines.

    `max_bytes` bounds the bytes of uncommitted records (SpoolFull beyond it).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int,
        fsync: bool = True,
        segment_bytes: int = _SEGMENT_BYTES,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # records are tenants' data
        self._lock_fd = _lock_directory(self.dir)
        self.max_bytes = max_bytes
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self.quarantined = 0  # bad stretches found on open (kept in quarantine-*.bad files)
        self._committed = self._read_checkpoint()
        # segment number -> (max seq in it, bytes)
        self._segments: dict[int, list[int]] = {}
        self._pending: dict[int, int] = {}  # seq -> record bytes, not yet committed
        self._since: dict[int, float] = {}  # seq -> monotonic time appended (or found on open)
        self._done: set[int] = set()  # stored, but after a record still pending
        self._groups_path = self.dir / "groups.log"
        self._next_seq = self._committed + 1
        self._scan()
        # Sequence numbers no record holds any more (quarantined) must not stall the checkpoint.
        self._done.update(
            q for q in range(self._committed + 1, self._next_seq) if q not in self._pending
        )
        self._seg_no = max(self._segments, default=0) + 1
        self._open_segment()
        self._written = 0  # records written to the active segment's fd (monotonic)
        self._synced = 0
        self._closed = False  # set by close(), under both locks
        #: sync rounds (count): one covers every record written before it, so under
        #: concurrent appends this stays below the number of appends (group commit)
        self.syncs = 0

    # ------------------------------------------------------------ open / scan

    def _read_checkpoint(self) -> int:
        try:
            return int((self.dir / "committed").read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            return 0

    def _scan(self) -> None:
        for path in sorted(self.dir.glob("seg-*.log")):
            n = int(path.stem.split("-")[1])
            max_seq, size = 0, 0
            for rec, start, end in self._frames(path):
                max_seq = max(max_seq, rec.seq)
                if rec.seq > self._committed:
                    self._pending[rec.seq] = end - start
                    self._since[rec.seq] = time.monotonic()
                self._next_seq = max(self._next_seq, rec.seq + 1)
                size = end
            self._segments[n] = [max_seq, max(size, path.stat().st_size)]
        self._gc()

    def _quarantine(self, path: Path, data: bytes, start: int, end: int) -> None:
        """Keep bytes that are not a valid record aside (never acknowledged: a torn tail; or
        corrupted on disk) and report them; the records around them are still replayed."""
        q = self.dir / f"quarantine-{path.stem}-{start:012d}.bad"
        if not q.exists():
            q.write_bytes(data[start:end])
        self.quarantined += 1
        msg = f"spool: {end - start} unreadable bytes (torn or corrupt record) at {path.name}:{start} quarantined in {q.name}"
        log.warning(msg)
        print(msg, file=sys.stderr, flush=True)

    def _frames(self, path: Path) -> Iterator[tuple[SpoolRecord, int, int]]:
        """Valid records of a segment as (record, start, end); bad stretches are skipped by
        resyncing on the next frame that checks out, and quarantined."""
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            rec = _parse_frame(data, pos)
            if rec is not None:
                yield rec
                pos = rec[2]
                continue
            nxt = data.find(_MAGIC, pos + 1)
            while nxt >= 0 and _parse_frame(data, nxt) is None:
                nxt = data.find(_MAGIC, nxt + 1)
            bad_end = len(data) if nxt < 0 else nxt
            self._quarantine(path, data, pos, bad_end)
            pos = bad_end

    @staticmethod
    def _read_segment(path: Path) -> Iterator[tuple[SpoolRecord, int]]:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            rec = _parse_frame(data, pos)
            if rec is None:
                nxt = data.find(_MAGIC, pos + 1)
                while nxt >= 0 and _parse_frame(data, nxt) is None:
                    nxt = data.find(_MAGIC, nxt + 1)
                if nxt < 0:
                    return
                pos = nxt
                continue
            yield rec[0], rec[2]
            pos = rec[2]

    def _open_segment(self) -> None:
        path = self.dir / _seg_name(self._seg_no)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._segments.setdefault(self._seg_no, [0, 0])
        if self._fsync:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    # ------------------------------------------------------------ write path

    @property
    def backlog_bytes(self) -> int:
        with self._lock:
            return sum(self._pending.values())

    @property
    def oldest_pending_age_s(self) -> float:
        """Seconds since the oldest record not yet committed was appended (0.0 when none;
        records found on open count from the open)."""
        with self._lock:
            first = min(self._since.values(), default=None)
        return 0.0 if first is None else time.monotonic() - first

    def append(self, header: dict[str, Any], body: bytes) -> int:
        """Write one record durably; return its sequence number. Raises SpoolFull, and
        SpoolClosed after close()."""
        with self._lock:
            if self._closed:
                raise SpoolClosed("spool closed")
            size = sum(self._pending.values())
            if size + len(body) > self.max_bytes and self._pending:
                raise SpoolFull(
                    f"spool holds {size} bytes not yet stored (limit {self.max_bytes}); retry later"
                )
            seq = self._next_seq
            hdr = json.dumps({**header, "seq": seq}, separators=(",", ":")).encode()
            # the frame's three parts go out in one writev, the body not copied (a request
            # is megabytes: the two copies cost ~2.5 ms of CPU per 5,000 spans, page faults included)
            crc = zlib.crc32(body, zlib.crc32(hdr))  # == crc32(hdr + body)
            prefix = _FRAME.pack(_MAGIC, len(hdr), len(body), crc)
            parts = [memoryview(x) for x in (prefix, hdr, body)]
            frame_len = sum(len(p) for p in parts)
            seg = self._segments[self._seg_no]
            try:
                while parts:  # os.writev may write less than asked (a nearly full disk)
                    n = os.writev(self._fd, parts)
                    while parts and n >= len(parts[0]):
                        n -= len(parts.pop(0))
                    if n:
                        parts[0] = parts[0][n:]
            except OSError:
                # Leave no torn frame behind: later records must stay readable.
                os.ftruncate(self._fd, seg[1])
                raise
            self._next_seq += 1
            seg[0] = seq
            seg[1] += frame_len
            self._pending[seq] = frame_len
            self._since[seq] = time.monotonic()
            self._written += 1
            mine = self._written
        self._sync(mine)
        return seq

    def _sync(self, target: int) -> None:
        with self._sync_lock:
            if self._synced >= target:
                return
            with self._lock:
                upto = self._written
                rotate = self._segments[self._seg_no][1] >= self._segment_bytes
            if self._fsync:
                os.fdatasync(self._fd)
            self._synced = upto
            self.syncs += 1
            if rotate:
                with self._lock:
                    os.close(self._fd)
                    self._seg_no += 1
                    self._open_segment()

    # ------------------------------------------------------------ read / commit

    def uncommitted(self) -> Iterator[SpoolRecord]:
        """Records not yet committed, in sequence order (for replay after a crash)."""
        for n in sorted(self._segments):
            path = self.dir / _seg_name(n)
            if not path.exists():
                continue
            for rec, _end in self._read_segment(path):
                if rec.seq > self._committed:
                    yield rec

    def commit(self, *seqs: int) -> None:
        """Mark records `seqs` stored (a write group's at once: the checkpoint file is written
        once for them, not once each, while appends wait for the lock). The checkpoint
        advances over the contiguous run of stored records (a later record stored first does
        not cover an earlier one still queued). It is not fsynced: losing it only replays
        records whose inserts are deduplicated."""
        with self._lock:
            for seq in seqs:
                self._pending.pop(seq, None)
                self._since.pop(seq, None)
                if seq > self._committed:
                    self._done.add(seq)
            advanced = False
            while self._committed + 1 in self._done:
                self._committed += 1
                self._done.discard(self._committed)
                advanced = True
            if not advanced:
                return
            tmp = self.dir / "committed.tmp"
            tmp.write_text(str(self._committed))
            os.replace(tmp, self.dir / "committed")
            if (
                not self._pending
                and self._groups_path.exists()
                and self._groups_path.stat().st_size > 1 << 20
            ):
                self._groups_path.unlink()  # nothing left to replay: the group log can restart
            self._gc()

    @property
    def committed(self) -> int:
        """Every record up to this sequence number is stored."""
        return self._committed

    # ------------------------------------------------------------ write groups

    def log_group(self, seqs: list[int]) -> None:
        """Durably note that records `seqs` are written together (one dedup token), before the
        write: a replay after a crash must regroup them exactly."""
        line = (json.dumps({"seqs": seqs}, separators=(",", ":")) + "\n").encode()
        with self._sync_lock:
            fd = os.open(self._groups_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)

    def groups(self) -> dict[int, tuple[int, ...]]:
        """seq -> the sorted seqs of its logged write group (records not in a group: absent)."""
        out: dict[int, tuple[int, ...]] = {}
        try:
            text = self._groups_path.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                seqs = tuple(sorted(int(x) for x in json.loads(line)["seqs"]))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: that group was never written
            for q in seqs:
                out[q] = seqs
        return out

    def _gc(self) -> None:
        active = getattr(self, "_seg_no", None)
        for n, (max_seq, _size) in list(self._segments.items()):
            if n != active and max_seq <= self._committed:
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / _seg_name(n)).unlink()
                del self._segments[n]

    def close(self) -> None:
        """Sync and close the active segment, release the directory. A second call does
        nothing; append() raises SpoolClosed from now on."""
        with self._sync_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fsync:
                os.fdatasync(self._fd)
            # the records written before this sync are durable: an append that wrote its frame
            # before close() finds its target synced and returns without touching the fd
            self._synced = self._written
            os.close(self._fd)
            os.close(self._lock_fd)  # releases the directory's lock
