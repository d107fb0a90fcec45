"""Batch ingest of OTLP files, and the pure "requests -> store" path serve's writer shares.

Accepted files (optionally gzip-compressed, detected by magic bytes):
- OTLP/JSON: one ExportTraceServiceRequest document, or JSON lines (one request per line, as
  the OpenTelemetry Collector's file exporter writes them);
- OTLP/protobuf: one ExportTraceServiceRequest, or the Collector file exporter's proto format
  (each message prefixed by its 4-byte big-endian length).
Each request becomes one ingest batch whose id derives from tenant and body, exactly as in
serve: ingesting a file twice, or a file serve already received, stores nothing twice.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest._decode import JSON, PROTOBUF, DecodeError, decode_request
from ingest._inserts import last_chain_hash, make_token, write_batch

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["IngestSummary", "ingest_requests", "read_requests"]


@dataclass(slots=True)
class IngestSummary:
    """Counts of one ingest run. `duplicates` counts spans of requests already stored."""

    files: int = 0
    requests: int = 0
    spans_read: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # requests that could not be decoded

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "requests": self.requests,
            "spans_read": self.spans_read,
            "stored": self.stored,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "reject_reasons": dict(self.reasons.most_common()),
            "errors": self.errors,
        }


def _read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data


def _proto_frames(data: bytes) -> list[bytes] | None:
    """Split the Collector's length-prefixed proto stream; None when `data` is not one."""
    frames, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            return None
        n = int.from_bytes(data[pos : pos + 4], "big")
        if n == 0 or pos + 4 + n > len(data):
            return None
        frames.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return frames or None


def read_requests(path: str | Path) -> Iterator[tuple[str, bytes, str]]:
    """Yield (format, body, where) for each OTLP request in the file.

    `where` is 'file' or 'file:line N' / 'file:message N' for error reports. Raises
    DecodeError when the file is neither OTLP JSON nor OTLP protobuf.
    """
    p = Path(path)
    data = _read_bytes(p)
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            yield JSON, data, str(p)
            return
        if isinstance(doc, list):
            for i, item in enumerate(doc):
                yield JSON, json.dumps(item).encode(), f"{p}:item {i}"
            return
        for i, line in enumerate(data.splitlines(), 1):
            if line.strip():
                yield JSON, line, f"{p}:line {i}"
        return
    frames = _proto_frames(data)
    if frames is not None and len(frames) > 1:
        for i, fr in enumerate(frames):
            yield PROTOBUF, fr, f"{p}:message {i}"
        return
    if frames is not None and len(frames) == 1:
        # One frame tiling the file exactly: a length-prefixed single message.
        yield PROTOBUF, frames[0], str(p)
        return
    yield PROTOBUF, data, str(p)


def ingest_requests(
    client: Client,
    database: str,
    requests: Iterable[tuple[str, bytes, str]],
    *,
    tenant: str = "default",
    source: str = "file",
    clock: Callable[[], float] | None = None,
    progress: Callable[[int], None] | None = None,
    summary: IngestSummary | None = None,
) -> IngestSummary:
    """Decode, validate and store each (format, body, where) request as one ingest batch.

    The same pure functions as serve (decode_request, write_batch), without a spool: use it
    for files and for the embedded store in tests. A request that cannot be decoded is
    recorded in summary.errors and skipped. `progress(spans)` is called after each request.
    """
    import time as _time

    now = clock or _time.time
    s = summary or IngestSummary()
    chain = last_chain_hash(client, database)
    for fmt, body, where in requests:
        s.requests += 1
        try:
            decoded = decode_request(body, fmt, tenant=tenant)
        except DecodeError as exc:
            s.errors.append(f"{where}: {exc}")
            continue
        s.spans_read += decoded.spans
        if decoded.spans:
            batch_id = make_token(tenant, hashlib.sha256(body).hexdigest())
            seen = client.query(
                f"SELECT count() FROM {database}.ingest_batches WHERE ingest_batch = {{b:String}}",
                parameters={"b": batch_id},
            ).result_rows[0][0]
            if seen:
                s.duplicates += decoded.spans
            else:
                res = write_batch(
                    client,
                    database,
                    [decoded],
                    batch_id=batch_id,
                    prev_chain=chain,
                    received_at_ms=int(now() * 1000),
                    source=source,
                )
                chain = res.chain_hash
                s.stored += res.stored
                s.rejected += res.rejected
                for r in decoded.rejects:
                    s.reasons[r.reason] += 1
        if progress:
            progress(decoded.spans)
    return s
