"""Shared helpers of the reliability suite: requests, span builders, polling, tmpfs mounts.

Every wait polls a condition against a deadline (no sleep-to-wait); every random choice comes
from a seeded `random.Random` so a failure replays.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from google.rpc import status_pb2

from ingest.testing import request_protobuf, span_json, transition

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
TOKENS = "tok-acme=acme,tok-globex=globex"  # module_serve's bearer tokens -> tenants
ACME = {"Authorization": "Bearer tok-acme"}
GLOBEX = {"Authorization": "Bearer tok-globex"}
RETRYABLE = frozenset({429, 502, 503, 504})  # OTLP/HTTP: retry these, drop on other errors


@dataclass(frozen=True, slots=True)
class Sent:
    """One request body and the span ids it carries."""

    body: bytes
    span_ids: tuple[str, ...]


def handoff_request(
    rng: random.Random,
    n: int,
    *,
    start_ns: int | None = None,
    prefix: str = "h",
    extra: dict | None = None,
) -> Sent:
    """`n` create transitions (fresh handoff ids) as one OTLP protobuf request."""
    now = start_ns if start_ns is not None else time.time_ns()
    spans = []
    for i in range(n):
        attrs = transition(
            f"{prefix}-{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}",
            "create",
            "",
            "created",
            task_id=f"t-{rng.getrandbits(32):08x}",
        )
        attrs.update(extra or {})
        spans.append(
            span_json(
                trace_id=f"{rng.getrandbits(128) | 1:032x}",
                span_id=f"{rng.getrandbits(64) | 1:016x}",
                attributes=attrs,
                start_ns=now + i,
                end_ns=now + i + 1000,
            )
        )
    return Sent(request_protobuf(spans), tuple(s["spanId"] for s in spans))


def post(
    url: str, body: bytes, headers: dict | None = None, timeout: float = 20
) -> requests.Response:
    return requests.post(f"{url}/v1/traces", data=body, headers=headers or PB, timeout=timeout)


def post_until_acked(
    url: str, body: bytes, *, headers: dict | None = None, timeout: float = 60
) -> list[int]:
    """POST like an OTLP exporter: retry 429/502/503/504 and refused connections (honouring
    Retry-After, capped at 0.5 s) until 200. Returns every status seen; raises on any other
    status or when `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while time.monotonic() < deadline:
        try:
            r = post(url, body, headers)
        except requests.ConnectionError:
            seen.append(0)
            time.sleep(0.05)
            continue
        seen.append(r.status_code)
        if r.status_code == 200:
            return seen
        if r.status_code not in RETRYABLE:
            raise AssertionError(f"non-retryable {r.status_code}: {r.text[:300]}")
        time.sleep(min(float(r.headers.get("Retry-After", 0.1)), 0.5))
    raise TimeoutError(f"not acknowledged within {timeout}s; statuses {seen[-10:]}")


def stored_span_ids(handle, table: str = "otel_traces") -> Counter:
    """Span id -> number of stored rows, read through serve's query port."""
    c = handle.client()
    try:
        rows = c.query(f"SELECT SpanId, count() FROM {table} GROUP BY SpanId").result_rows
    finally:
        c.close()
    return Counter(dict(rows))


def explains(r: requests.Response, fmt: str) -> str:
    """The reason in an OTLP error body (google.rpc.Status, protobuf or JSON); asserts one."""
    if fmt == "protobuf" and r.headers.get("Content-Type") == "application/x-protobuf":
        msg = status_pb2.Status.FromString(r.content).message
    else:
        msg = r.json()["message"]
    assert msg.strip(), f"{r.status_code} without a reason"
    return msg


def health_or_none(handle) -> dict | None:
    try:
        return handle.health(timeout=5)
    except Exception:
        return None


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. '2m') at `path` (needs root); lazily unmounted after.
    Mode 0700 (a tmpfs root is 1777 by default, which serve refuses as its store or spool)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        import pytest

        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave: int = 0) -> Path:
    """Fill the filesystem holding `path` with a ballast file, leaving about `leave` bytes."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize - leave
    ballast = path / "ballast"
    with open(ballast, "wb") as f, contextlib.suppress(OSError):
        while free > 0:
            chunk = min(free, 1 << 20)
            f.write(b"\0" * chunk)
            free -= chunk
        f.flush()
    return ballast


class Streamer(threading.Thread):
    """A client streaming `spans`-span requests back to back, retrying each one like an OTLP
    exporter (429/502/503/504 and refused connections) until acknowledged. Counts statuses;
    any other status is recorded in `errors` and that request dropped."""

    def __init__(self, url: str, seed: int, spans: int = 5) -> None:
        super().__init__(name=f"streamer-{seed}", daemon=True)
        self.url, self.rng, self.spans = url, random.Random(seed), spans
        self.acked: list[str] = []
        self.statuses: Counter = Counter()
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            sent = handoff_request(self.rng, self.spans)
            while True:
                try:
                    r = post(self.url, sent.body)
                except requests.RequestException:
                    self.statuses[0] += 1
                    time.sleep(0.05)
                    continue
                self.statuses[r.status_code] += 1
                if r.status_code == 200:
                    self.acked.extend(sent.span_ids)
                    break
                if r.status_code not in RETRYABLE:
                    self.errors.append(f"{r.status_code}: {r.text[:200]}")
                    break
                if not r.headers.get("Retry-After"):
                    self.errors.append(f"{r.status_code} without Retry-After")
                time.sleep(min(float(r.headers.get("Retry-After", 0.1)), 0.2))
