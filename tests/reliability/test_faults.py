"""Faults survived by `handoffs serve`: store disk full, spool disk full, corrupted spool,
clock jumps, a span the store cannot hold.

Each test asserts what the client saw (status codes), what was stored, that nothing
acknowledged was lost, and how serve recovered. The kill -9 crash loop is in
tests/integration/test_crash.py (not repeated here); the store reached over HTTP going down
(refused connections -> 503, spool replayed on restart) is in
tests/integration/test_serve_backpressure.py.

Faults are injected for real: a tmpfs mounted at the store or spool directory and filled
with a ballast file (needs root; skipped otherwise), bytes garbled in a real spool segment.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ingest import Spool, make_token
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import wait_until
from tests.reliability._helpers import (
    fill,
    handoff_request,
    health_or_none,
    post,
    post_until_acked,
    stored_span_ids,
    tmpfs,
)

# ------------------------------------------------------------------ store disk full


def test_store_disk_full_answers_503_then_recovers_losing_nothing_acked(
    start_serve, tmp_path: Path
):
    """Store dir on a 64 MiB tmpfs, filled: chDB cannot reserve space for a part.

    Client: 200 while the failure is not yet known (the request is spooled), then 503 +
    Retry-After naming the store error. Recovery: ballast removed, the writer's retry
    succeeds, the retried requests are acknowledged. Stored == acknowledged, exactly once.
    """
    rng = random.Random(7001)
    with tmpfs(tmp_path / "mnt", "64m") as mnt:
        h = start_serve(
            tmp_path, store_dir=mnt / "data", extra_args=("--spool-dir", str(tmp_path / "spool"))
        )
        ballast = fill(mnt)
        acked: list[str] = []
        pending = []
        statuses: list[int] = []
        t_fail = time.monotonic()
        deadline = t_fail + 60
        while time.monotonic() < deadline:  # until serve has refused three requests
            sent = handoff_request(rng, 5)
            r = post(h.otlp_url, sent.body)
            statuses.append(r.status_code)
            if r.status_code == 200:
                acked += sent.span_ids
            else:
                assert r.status_code == 503, r.text
                assert r.headers["Retry-After"] == "1"
                assert "store is failing" in r.text and "NOT_ENOUGH_SPACE" in r.text
                pending.append(sent)
            if statuses.count(503) >= 3:
                break
            time.sleep(0.05)  # a client's pace, not a wait for a condition
        assert statuses.count(503) >= 3, statuses
        health = health_or_none(h)
        assert health is None or health["status"] == "store_unavailable"
        os.unlink(ballast)
        t_free = time.monotonic()
        for sent in pending:  # the client's retries
            seen = post_until_acked(h.otlp_url, sent.body, timeout=60)
            assert set(seen) <= {200, 503}, seen
            acked += sent.span_ids
        h.wait_stored(60)
        recovered_s = time.monotonic() - t_free
        stored = stored_span_ids(h)
        assert set(stored) == set(acked)
        assert max(stored.values()) == 1
        h.stop()
    print(
        f"FIGURES store_disk_full: acked={len(acked)} stored={sum(stored.values())} "
        f"refused_503={statuses.count(503)} first_200s={statuses.index(503)} "
        f"fault_s={t_free - t_fail:.1f} recover_s={recovered_s:.1f}"
    )


def test_sigterm_while_the_store_disk_is_full_stops_keeping_the_spool(start_serve, tmp_path: Path):
    """SIGTERM while every write fails for want of disk: serve stops within seconds (exit 1,
    "NOT drained, spool kept"), not after its whole drain timeout; the next start, with space
    again, stores every acknowledged span exactly once."""
    rng = random.Random(7011)
    spool_dir = tmp_path / "spool"
    with tmpfs(tmp_path / "mnt", "64m") as mnt:
        h = start_serve(
            tmp_path, store_dir=mnt / "data", extra_args=("--spool-dir", str(spool_dir))
        )
        ballast = fill(mnt)
        acked: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the writer has met the full disk
            sent = handoff_request(rng, 5)
            r = post(h.otlp_url, sent.body)
            if r.status_code == 200:
                acked += sent.span_ids
            elif r.status_code == 503:
                break
            time.sleep(0.05)  # a client's pace, not a wait for a condition
        assert acked, "no request was acknowledged before the store failed"
        t_stop = time.monotonic()
        code = h.stop(timeout=60)
        stop_s = time.monotonic() - t_stop
        assert code == 1, h.log()[-2000:]
        assert stop_s < 20, f"stop took {stop_s:.1f}s"
        assert "NOT drained, spool kept for replay" in h.log()
        os.unlink(ballast)
        h2 = start_serve(
            tmp_path, store_dir=mnt / "data", extra_args=("--spool-dir", str(spool_dir))
        )
        h2.wait_stored(60)
        stored = stored_span_ids(h2)
        assert set(stored) == set(acked) and max(stored.values()) == 1
        h2.stop()
    print(f"FIGURES sigterm_disk_full: acked={len(acked)} stop_s={stop_s:.1f}")


# ------------------------------------------------------------------ spool disk full


def test_spool_disk_full_answers_503_with_retry_after(start_serve, tmp_path: Path):
    """Spool dir on a 1 MiB tmpfs, filled: the fsynced append cannot be written.

    OTLP clients retry only 429/502/503/504, so a disk-full spool must answer 503 (it is
    back-pressure, not a bad request); after space returns, the retried requests are stored.
    """
    rng = random.Random(7002)
    with tmpfs(tmp_path / "spool", "1m") as spool:
        h = start_serve(tmp_path, extra_args=("--spool-dir", str(spool)))
        ballast = fill(spool)
        sent = handoff_request(rng, 20)
        r = post(h.otlp_url, sent.body)
        status, text = r.status_code, r.text
        os.unlink(ballast)
        post_until_acked(h.otlp_url, sent.body, timeout=60)
        h.wait_stored(60)
        assert set(stored_span_ids(h)) == set(sent.span_ids)
        h.stop()
    print(f"FIGURES spool_disk_full: first_status={status} body={text[:80]!r}")
    assert status == 503, text
    assert r.headers.get("Retry-After")


def test_spool_keeps_every_acknowledged_record_across_a_disk_full_episode(tmp_path: Path):
    """A nearly full disk: each append either fails (and is not acknowledged) or is durable
    whole; records appended once space returns are readable too (a short write must not
    leave a torn frame that hides every later record on reopen)."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        spool = Spool(mnt / "spool", max_bytes=1 << 30)
        acked = [spool.append({"n": 0}, b"a" * 1000)]
        ballast = fill(mnt)
        for n in (1, 2):  # disk full: each append either raises or is durable
            with contextlib.suppress(OSError):
                acked.append(spool.append({"n": n}, bytes([n]) * 10_000))
        os.unlink(ballast)
        acked.append(spool.append({"n": 3}, b"c" * 1000))
        spool.close()
        reopened = Spool(mnt / "spool", max_bytes=1 << 30)
        replay = [r.seq for r in reopened.uncommitted()]
        reopened.close()
    print(f"FIGURES spool_enospc: acked={acked} replayable={replay}")
    assert replay == acked


# ------------------------------------------------------------------ corrupted spool


def _spool_records(spool_dir: Path, n: int, rng: random.Random) -> list[tuple[str, ...]]:
    """Write n uncommitted records into a spool exactly as serve would (header fields of
    ingest's Ingestor), as if serve had crashed before storing them; returns their span ids."""
    spool = Spool(spool_dir, max_bytes=1 << 30)
    ids = []
    for _ in range(n):
        sent = handoff_request(rng, 3)
        header = {
            "tenant": "default",
            "fmt": "protobuf",
            "batch": make_token("default", hashlib.sha256(sent.body).hexdigest()),
            "received_at_ms": int(time.time() * 1000),
        }
        spool.append(header, sent.body)
        ids.append(sent.span_ids)
    spool.close()
    return ids


def _segment(spool_dir: Path) -> Path:
    (seg,) = sorted(spool_dir.glob("seg-*.log"))
    return seg


def _record_offsets(data: bytes) -> list[int]:
    """Start offsets of the frames in a segment (MAGIC | hlen | blen | crc | ...)."""
    import struct

    out, pos = [], 0
    while pos + 16 <= len(data):
        _magic, hlen, blen, _crc = struct.unpack_from(">4sIII", data, pos)
        out.append(pos)
        pos += 16 + hlen + blen
    return out


def test_torn_spool_tail_replays_intact_records_and_serve_starts(start_serve, tmp_path: Path):
    """A crash mid-append leaves a torn last frame: never acknowledged, so cutting it is right;
    the records before it are replayed on start and stored once."""
    store = tmp_path / "data"
    ids = _spool_records(store / "spool", 5, random.Random(7003))
    seg = _segment(store / "spool")
    data = seg.read_bytes()
    last = _record_offsets(data)[-1]
    seg.write_bytes(data[: last + (len(data) - last) // 2])  # half of the last frame
    h = start_serve(tmp_path, store_dir=store)
    assert "replayed 4 spooled requests" in h.log()
    stored = stored_span_ids(h)
    assert set(stored) == {s for rec in ids[:4] for s in rec}
    assert max(stored.values()) == 1
    h.stop()


def test_garbled_spool_tail_is_quarantined_and_reported(start_serve, tmp_path: Path):
    """Bit rot in the last record (CRC mismatch): the intact records are replayed, serve starts,
    and the bad bytes are kept aside (quarantined) and reported, not silently cut."""
    store = tmp_path / "data"
    ids = _spool_records(store / "spool", 5, random.Random(7004))
    seg = _segment(store / "spool")
    data = bytearray(seg.read_bytes())
    data[-10:] = b"\xff" * 10
    seg.write_bytes(bytes(data))
    h = start_serve(tmp_path, store_dir=store)
    assert "replayed 4 spooled requests" in h.log()
    assert set(stored_span_ids(h)) == {s for rec in ids[:4] for s in rec}
    log = h.log().lower()
    kept = [
        p.name for p in (store / "spool").iterdir() if "quarantin" in p.name or "corrupt" in p.name
    ]
    h.stop()
    assert kept, "the corrupt bytes were not kept aside"
    assert "corrupt" in log or "quarantin" in log, "serve's log does not report the corruption"


def test_garbled_record_mid_spool_loses_only_that_record(start_serve, tmp_path: Path):
    """One garbled record mid-segment costs only that record: the reader resyncs on the next
    frame, so the acknowledged records after it are replayed (the reader must not stop and
    truncate at the first bad frame)."""
    store = tmp_path / "data"
    ids = _spool_records(store / "spool", 5, random.Random(7005))
    seg = _segment(store / "spool")
    data = bytearray(seg.read_bytes())
    offsets = _record_offsets(bytes(data))
    data[offsets[2] + 40] ^= 0xFF  # inside record 3's header/body: its CRC no longer matches
    seg.write_bytes(bytes(data))
    h = start_serve(tmp_path, store_dir=store)
    stored = set(stored_span_ids(h))
    h.stop()
    expected = {s for i, rec in enumerate(ids) if i != 2 for s in rec}
    print(f"FIGURES spool_mid_corruption: intact={len(expected)} stored={len(stored)}")
    assert stored == expected


# ------------------------------------------------------------------ clock jumps


def _spans(entries) -> bytes:
    return request_protobuf(
        [
            span_json(
                trace_id=f"{i + 0xABC:032x}",
                span_id=f"{i + 0xABC:016x}",
                attributes=attrs,
                start_ns=ts,
                end_ns=min(ts + 1000, 2**64 - 1),
            )
            for i, (attrs, ts) in enumerate(entries)
        ]
    )


def test_clock_jumps_are_stored_and_skew_is_flagged(serve_process):
    """Agents' clocks a day behind or ahead: stored as sent; an accept timestamped an hour
    before its create is flagged clock_skew by the analytics (order comes from the state
    machine, not from timestamps)."""
    from analytics import Window, anomalies, find_handoffs

    h = serve_process
    now = time.time_ns()
    hour = 3600 * 10**9
    body = _spans(
        [
            (transition("skewed", "create", "", "created", task_id="t-skew"), now),
            (transition("skewed", "accept", "created", "accepted", task_id="t-skew"), now - hour),
            (transition("future", "create", "", "created", task_id="t-fut"), now + 24 * hour),
            (transition("past", "create", "", "created", task_id="t-past"), now - 48 * hour),
        ]
    )
    r = post(h.otlp_url, body)
    assert r.status_code == 200 and r.content == b""
    h.wait_stored(60)
    c = h.client()
    try:
        rows = c.query(
            "SELECT handoff_id, count() FROM handoff_transitions GROUP BY handoff_id"
        ).result_rows
        assert dict(rows) == {"skewed": 2, "future": 1, "past": 1}
        at = datetime.fromtimestamp(now / 1e9, UTC)
        win = Window(start=at - timedelta(days=3), end=at + timedelta(days=2), as_of=at)
        an = anomalies(c, database=h.database, window=win).set_index("kind")
        assert an.loc["clock_skew", "count"] == 1
        assert an.loc["clock_skew", "examples"] == ["skewed"]
        assert list(find_handoffs(c, database=h.database, query="future")["handoff_id"]) == [
            "future"
        ]
    finally:
        c.close()


def test_acknowledged_spans_with_extreme_clocks_are_kept_or_counted(serve_process):
    """Clocks at 1970 and 2262: acknowledged, and kept (retention counts from ingest time),
    not dropped at insert by a TTL on the span's own timestamp (regression)."""
    h = serve_process
    body = _spans(
        [
            (transition("epoch", "create", "", "created", task_id="t-e"), 10**9),  # 1970
            (transition("far", "create", "", "created", task_id="t-f"), 2**63 - 1),  # 2262
        ]
    )
    assert post(h.otlp_url, body).status_code == 200
    health = h.wait_stored(60)
    c = h.client()
    try:
        kept = c.query("SELECT handoff_id FROM handoff_transitions").result_rows
        ledger = c.query("SELECT count() FROM transition_ledger").result_rows[0][0]
    finally:
        c.close()
    print(f"FIGURES extreme_clock: acked=2 ledger={ledger} kept={len(kept)} health={health}")
    assert sorted(k for (k,) in kept) == ["epoch", "far"]


# ------------------------------------------------------------------ poison span


def _handoff_ids(h) -> list[tuple[str]]:
    c = h.client()
    try:
        return c.query("SELECT DISTINCT handoff_id FROM handoff_transitions").result_rows
    finally:
        c.close()


def test_span_the_store_cannot_hold_does_not_block_ingest(start_serve, tmp_path: Path):
    """startTimeUnixNano = 2**64-1 (legal fixed64, past DateTime64(9)) is refused at decode,
    not acknowledged and retried forever by the writer (regression: it wedged serve with
    503s for every later request, across restarts)."""
    h = start_serve(tmp_path)
    try:
        attrs = transition("poison", "create", "", "created")
        poison = _spans([(attrs, 2**64 - 1)])
        first = post(h.otlp_url, poison)
        ok = handoff_request(random.Random(7006), 3)
        # Either refused up front (4xx/partial_success) or stored; later traffic must flow.
        post_until_acked(h.otlp_url, ok.body, timeout=20)
        wait_until(lambda: set(ok.span_ids) <= set(stored_span_ids(h)), 20, "later spans stored")
        assert first.status_code == 200  # the span alone is rejected (OTLP partial success)
        resp = ExportTraceServiceResponse.FromString(first.content)
        assert resp.partial_success.rejected_spans == 1
        assert "2262" in resp.partial_success.error_message
        assert "poison" not in {r[0] for r in _handoff_ids(h)}
    finally:
        h.kill()  # a stuck writer would make a graceful stop wait its full drain timeout
