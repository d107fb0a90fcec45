"""Soak: hold `handoffs serve` at a steady rate near its measured capacity; check nothing leaks.

1. Start serve (embedded chDB in a temp dir, a subprocess, as in production).
2. Calibrate (--calibrate-s): --clients closed-loop clients post as fast as serve answers;
   capacity = the slower of the acknowledged and the stored span rates (spans/s) — the
   spool acknowledges before the store writes, so only the stored rate is sustainable.
   Serve then drains before the soak starts.
3. Soak (--duration s): the same clients, open loop, paced to --load x capacity (or --rate
   spans/s), each request --spans-per-request raw OTLP protobuf spans (create + accept
   transitions of fresh handoffs), retried like an OTLP exporter on 429/502/503/504 and on
   refused/timed-out connections; any other status is an error and the request is dropped.
4. Every --sample-s: serve's memory (/proc/<pid>/status: VmRSS, and apart RssAnon, the
   memory serve holds, and RssFile, file-backed pages such as the chDB library's code,
   shared and reclaimable), its /health counters, and each table's active parts in its
   fullest partition (system.parts; the engine's too-many-parts limits count per
   partition), printed at the end as a table over time.
5. End: stop clients, wait for serve to store everything, read every stored SpanId back
   through serve's read-only ClickHouse HTTP port and compare with the acknowledged ones.

Asserts nothing; prints the samples, then the figures, last line:
`RESULT acked=<n> stored=<n> duplicates=<n> rss_growth_mb=<n> ... anon_growth_mb=<n>
anon_max_mb=<n>` (with --find-sustained also `sustained_spans_per_s=<n>
capacity_spans_per_s=<n>`) where stored counts the acknowledged span ids found, duplicates the extra
rows of any span id, and a growth is the median of the last fifth of the soak minus that of
its first fifth (after warm-up), of RSS or of anonymous memory. A leak is anonymous memory
(file-backed pages come and go with the code that runs), so the anonymous growth is printed
as within or OVER --rss-bound-mb (default 100 MiB).

--find-sustained: instead of one soak, the sustained rate: holds of --hold-s seconds (default
1200) at rates from 0.9 x the calibrated capacity (or --rate) down by 0.75 until one holds,
then --refine bisections; a hold holds when every table's active parts stay bounded and flat,
serve refuses nothing for too many parts and the store keeps up (bench/_sustained.py says
exactly how). Each hold prints its parts table and verdict; a hold that cannot hold any more
(refusals for parts, a table over serve's limit) ends early.

    python bench/soak.py [--duration 600] [--clients 4] [--load 0.8 | --rate N]
    python bench/soak.py --find-sustained [--hold-s 1200] [--refine 2]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench._sustained import (
    PARTS_SQL,
    Hold,
    Sample,
    Verdict,
    early_stop,
    judge,
    next_rate,
    parts_by_table,
    parts_table,
    sustained,
)
from serve.procstat import MEMORY_FIELDS, memory_kb
from serve.testing import start_serve

_RETRYABLE = frozenset({429, 502, 503, 504})
_PB = {"Content-Type": "application/x-protobuf"}


def _attr(span, key: str, value: str) -> None:
    kv = span.attributes.add()
    kv.key = key
    kv.value.string_value = value


def build_request(rng: random.Random, n: int, client: int, seq: int) -> tuple[bytes, list[str]]:
    """n spans (pairs of create + accept transitions of fresh handoffs) as OTLP protobuf."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", f"soak-agent-{client}"
    ss = rs.scope_spans.add()
    ss.scope.name = "bench.soak"
    now = time.time_ns()
    ids = []
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id = rng.getrandbits(128).to_bytes(16, "big") or b"\1" * 16
        sid = (rng.getrandbits(64) | 1).to_bytes(8, "big")
        sp.span_id = sid
        ids.append(sid.hex())
        sp.name = "handoff.transition"
        sp.kind = 1
        sp.start_time_unix_nano = now + i
        sp.end_time_unix_nano = now + i + 1000
        h = f"soak-{client}-{seq}-{i // 2}"
        _attr(sp, "handoff.task_id", f"task-{client}-{seq}")
        _attr(sp, "handoff.handoff_id", h)
        _attr(sp, "handoff.actor", "agent-b")
        if i % 2 == 0:
            for k, v in (
                ("handoff.event", "create"),
                ("handoff.from_state", ""),
                ("handoff.to_state", "created"),
                ("handoff.protocol", "aa-handoff/v1"),
                ("handoff.mode", "delegate"),
                ("handoff.from_agent", "agent-a"),
                ("handoff.to_agent", "agent-b"),
            ):
                _attr(sp, k, v)
        else:
            for k, v in (
                ("handoff.event", "accept"),
                ("handoff.from_state", "created"),
                ("handoff.to_state", "accepted"),
            ):
                _attr(sp, k, v)
    return req.SerializeToString(), ids


@dataclass
class ClientStats:
    acked_ids: list[str] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    requests_acked: int = 0
    retries: int = 0
    dropped_requests: int = 0
    rejected_spans: int = 0
    conn_errors: int = 0
    timeouts: int = 0
    error_examples: list[str] = field(default_factory=list)


class Client(threading.Thread):
    """One OTLP client: paced (interval s between request starts) or closed loop (0)."""

    def __init__(self, url: str, idx: int, seed: int, spans: int) -> None:
        super().__init__(name=f"soak-client-{idx}", daemon=True)
        self.url = f"{url}/v1/traces"
        self.idx = idx
        self.rng = random.Random(seed * 1000 + idx)
        self.spans = spans
        self.interval = 0.0
        self.stop = threading.Event()
        self.stats = ClientStats()
        self.seq = 0
        self.session = requests.Session()

    def _send(self, body: bytes, ids: list[str]) -> None:
        st = self.stats
        delay = 0.05
        while True:
            try:
                r = self.session.post(self.url, data=body, headers=_PB, timeout=30)
            except requests.Timeout:
                st.timeouts += 1
                st.retries += 1
                continue
            except requests.ConnectionError:
                st.conn_errors += 1
                st.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            st.statuses[r.status_code] += 1
            if r.status_code == 200:
                resp = ExportTraceServiceResponse()
                resp.ParseFromString(r.content)
                st.rejected_spans += resp.partial_success.rejected_spans
                st.acked_ids.extend(ids)
                st.requests_acked += 1
                return
            if r.status_code in _RETRYABLE:
                st.retries += 1
                time.sleep(min(float(r.headers.get("Retry-After", delay)), 1.0))
                continue
            st.dropped_requests += 1
            if len(st.error_examples) < 5:
                st.error_examples.append(f"{r.status_code}: {r.text[:200]}")
            return

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.stop.is_set():
            body, ids = build_request(self.rng, self.spans, self.idx, self.seq)
            self.seq += 1
            self._send(body, ids)
            if self.interval > 0:
                nxt += self.interval
                now = time.monotonic()
                if nxt > now:
                    self.stop.wait(nxt - now)
                else:
                    nxt = max(nxt, now - self.interval)  # behind: no catch-up burst beyond one


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and RssShmem of `pid` in MiB (0.0 each when the process is gone)."""
    out = dict.fromkeys(("VmRSS", *MEMORY_FIELDS), 0.0)
    with contextlib.suppress(OSError):
        out |= {k: kb / 1024 for k, kb in memory_kb(pid, tuple(out)).items()}
    return out


def _growth(values: list[float]) -> float:
    """Median of the last fifth minus median of the first fifth (0.0 without samples)."""
    k = max(1, len(values) // 5)
    return statistics.median(values[-k:]) - statistics.median(values[:k]) if values else 0.0


def _acked(clients: list[Client]) -> int:
    return sum(len(c.stats.acked_ids) for c in clients)


def _metrics(serve) -> tuple[int, int]:
    """(serve's active parts limit, requests it refused for too many parts so far), from
    GET /metrics (0, 0 when it has none)."""
    limit = refused = 0.0
    with contextlib.suppress(requests.RequestException):
        for line in requests.get(f"{serve.otlp_url}/metrics", timeout=10).text.splitlines():
            if line.startswith("handoffs_store_active_parts_limit "):
                limit = float(line.split()[-1])
            elif line.startswith("handoffs_receiver_refused_requests_total{") and (
                'reason="too_many_parts"' in line
            ):
                refused += float(line.split()[-1])
    return int(limit), int(refused)


@dataclass
class Soaked:
    """What the holds of one run saw: (t, memory, health) samples and the parts samples."""

    memory: list[tuple[float, dict[str, float], dict]] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)


def _hold(serve, q, rate: float, seconds: float, args, first: int, clients: list[Client],
          run: Soaked, *, stop_early: bool) -> tuple[Sample, ...]:  # fmt: skip
    """--clients paced clients (numbered from `first`, appended to `clients`) at `rate`
    spans/s for `seconds`; a sample every --sample-s: memory, /health, active parts per
    table. `stop_early`: end as soon as the hold cannot be steady (_sustained.early_stop)."""
    pid = serve.process.pid
    limit, refused0 = _metrics(serve)
    stored0 = serve.health()["stored"]
    soak = [Client(serve.otlp_url, first + i, args.seed, args.spans_per_request)
            for i in range(args.clients)]  # fmt: skip
    for c in soak:
        c.interval = args.spans_per_request * args.clients / rate
    clients += soak
    samples: list[Sample] = []
    t_start = time.monotonic()
    for c in soak:
        c.start()
    print("t_s rss_mib anon_mib file_mib acked stored spool_backlog_kib queued store_errors "
          "max_active_parts", flush=True)  # fmt: skip
    while (el := time.monotonic() - t_start) < seconds:
        time.sleep(min(args.sample_s, max(0.0, seconds - el)))  # the sampling period
        h, m = serve.health(), memory_mb(pid)
        parts = parts_by_table(q.query(PARTS_SQL, parameters={"db": serve.database}).result_rows)
        t = time.monotonic() - t_start
        run.memory.append((t, m, h))
        refused = _metrics(serve)[1] - refused0
        samples.append(Sample(t, parts, _acked(soak), h["stored"] - stored0, refused))
        top = max(parts.items(), key=lambda kv: kv[1], default=("-", 0))
        print(f"{t:.0f} {m['VmRSS']:.1f} {m['RssAnon']:.1f} {m['RssFile']:.1f} "
              f"{_acked(clients)} {h['stored']} {h['spool_backlog_bytes'] // 1024} "
              f"{h['queued']} {h['store_errors']} {top[1]} ({top[0]})", flush=True)  # fmt: skip
        why = early_stop(samples, limit=limit) if stop_early else None
        if why:
            print(f"hold at {rate:,.0f} spans/s ended early: {why}", flush=True)
            break
    for c in soak:
        c.stop.set()
    for c in soak:
        c.join()
    return tuple(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="soak seconds (default 600)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent OTLP clients (threads)")
    ap.add_argument("--spans-per-request", type=int, default=200)
    ap.add_argument("--calibrate-s", type=float, default=20, help="capacity probe seconds")
    ap.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    ap.add_argument("--rate", type=float, help="spans/s instead of calibrating (skips probe)")
    ap.add_argument("--sample-s", type=float, default=5, help="RSS/health/parts sampling period")
    ap.add_argument(
        "--rss-bound-mb", type=float, default=100, help="RSS growth reported as within/over this"
    )
    ap.add_argument(
        "--find-sustained",
        action="store_true",
        help="search the sustained rate instead of one soak: holds of --hold-s at rates from "
        "0.9 x the calibrated capacity (or --rate) down, then bisected (bench/_sustained.py)",
    )
    ap.add_argument("--hold-s", type=float, default=1200,
                    help="--find-sustained: seconds each rate is held (default 1200)")  # fmt: skip
    ap.add_argument("--refine", type=int, default=2,
                    help="--find-sustained: bisections once a rate held (default 2)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--workdir", help="where serve's store goes (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.clients < 1 or args.spans_per_request < 1:
        ap.error("--duration, --clients and --spans-per-request must be positive")
    if args.find_sustained and args.hold_s < 6 * args.sample_s:
        ap.error("--hold-s must be at least 6 x --sample-s (a hold is judged on its samples)")
    if args.sample_s <= 0 or args.refine < 0:
        ap.error("--sample-s must be > 0 seconds and --refine >= 0")

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    # the check at the end reads every stored span id back through the query port: one row
    # each, past the port's default result bounds after ~1 million spans
    serve = start_serve(
        work,
        env={
            "HANDOFFS_QUERY_MAX_RESULT_ROWS": str(10**9),
            "HANDOFFS_QUERY_MAX_RESULT_BYTES": str(1 << 40),
        },
    )
    pid = serve.process.pid
    clients = [
        Client(serve.otlp_url, i, args.seed, args.spans_per_request) for i in range(args.clients)
    ]
    run = Soaked()
    capacity = 0.0
    q = serve.client(send_receive_timeout=600)
    try:
        rss0 = memory_mb(pid)["VmRSS"]
        print(f"serve pid {pid}, RSS at start {rss0:.1f} MiB; store {serve.store_dir}", flush=True)
        if args.rate:
            rate = capacity = args.rate
            print(f"rate {rate:.0f} spans/s (given)", flush=True)
            clients = []  # no calibration clients
        else:
            h0, t0 = serve.health(), time.monotonic()
            for c in clients:
                c.start()  # closed loop: interval 0
            time.sleep(args.calibrate_s)  # a fixed measuring period, not a wait for a condition
            h1, t1 = serve.health(), time.monotonic()
            acked_rate = _acked(clients) / (t1 - t0)
            stored_rate = (h1["stored"] - h0["stored"]) / (t1 - t0)
            capacity = min(acked_rate, stored_rate)
            rate = args.load * capacity
            for c in clients:
                c.stop.set()
            for c in clients:
                c.join()
            serve.wait_stored(300)
            print(
                f"capacity: acked {acked_rate:.0f} spans/s, stored {stored_rate:.0f} spans/s; "
                f"soak at {args.load:.2f} x {capacity:.0f} = {rate:.0f} spans/s",
                flush=True,
            )
        acked_before = _acked(clients)
        t_start = time.monotonic()
        if args.find_sustained:
            # Soak clients: their own seeds and ids (idx 100 + 10 x hold + i), so no span id
            # repeats another hold's or calibration's
            while (nxt := next_rate(run.holds, capacity, refine=args.refine)) is not None:
                rate = nxt
                print(f"\n--- hold {len(run.holds) + 1}: {rate:,.0f} spans/s "
                      f"({rate / capacity:.2f} x capacity) for {args.hold_s:.0f} s", flush=True)  # fmt: skip
                samples = _hold(serve, q, rate, args.hold_s, args, 100 + 10 * len(run.holds),
                                clients, run, stop_early=True)  # fmt: skip
                limit, _ = _metrics(serve)
                why = early_stop(samples, limit=limit) or (
                    f"{len(samples)} samples, too few to judge: serve answered slower than "
                    "--sample-s; lengthen --hold-s")  # fmt: skip
                verdict = judge(samples, rate=rate, limit=limit) if len(samples) >= 6 else (
                    Verdict(False, why))  # fmt: skip
                run.holds.append(Hold(rate, verdict, samples))
                print(parts_table(samples))
                print(f"hold at {rate:,.0f} spans/s: {'HELD' if verdict.holds else 'did not hold'}"
                      f" ({verdict.why})", flush=True)  # fmt: skip
                serve.wait_stored(600)
        else:
            samples = _hold(serve, q, rate, args.duration, args, 100, clients, run,
                            stop_early=False)  # fmt: skip
            print(parts_table(samples))
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join()
        elapsed = time.monotonic() - t_start
        final = serve.wait_stored(600)
        stored_rows = q.query("SELECT SpanId, count() FROM otel_traces GROUP BY SpanId").result_rows
    finally:
        q.close()
        for c in clients:
            c.stop.set()
        code = serve.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return _report(args, run, clients, stored_rows, final, code, rate=rate, rss0=rss0,
                   elapsed=elapsed, acked_before=acked_before, capacity=capacity)  # fmt: skip


def _report(args, run: Soaked, clients, stored_rows, final, code, *, rate, rss0, elapsed,
            acked_before, capacity) -> int:  # fmt: skip
    samples = run.memory
    stored_counts = dict(stored_rows)
    acked_ids = [i for c in clients for i in c.stats.acked_ids]
    acked_set = set(acked_ids)
    stored_acked = sum(1 for i in acked_set if i in stored_counts)
    duplicates = sum(n - 1 for n in stored_counts.values() if n > 1)
    missing = len(acked_set) - stored_acked
    unacked_stored = sum(1 for i in stored_counts if i not in acked_set)
    statuses: Counter = Counter()
    for c in clients:
        statuses.update(c.stats.statuses)
    dropped = sum(c.stats.dropped_requests for c in clients)
    soak_acked = len(acked_ids) - acked_before
    rss = [s[1]["VmRSS"] for s in samples]
    anon = [s[1]["RssAnon"] for s in samples]
    file_backed = [s[1]["RssFile"] for s in samples]
    k = max(1, len(rss) // 5)
    growth, anon_growth = _growth(rss), _growth(anon)
    backlog_max = max((s[2]["spool_backlog_bytes"] for s in samples), default=0)
    print()
    print(f"{len(run.holds)} holds in {elapsed:.0f} s, the last at {rate:.0f} spans/s" if run.holds
          else f"soak {elapsed:.0f} s at target {rate:.0f} spans/s: achieved {soak_acked / elapsed:.0f}")  # fmt: skip
    print(
        f"statuses {dict(sorted(statuses.items()))}; back-pressure 429/503: "
        f"{statuses[429] + statuses[503]}; other errors (dropped requests): {dropped}"
    )
    for c in clients:
        for e in c.stats.error_examples:
            print(f"  client {c.idx} error: {e}")
    print(
        f"retries {sum(c.stats.retries for c in clients)}, connection errors "
        f"{sum(c.stats.conn_errors for c in clients)}, timeouts "
        f"{sum(c.stats.timeouts for c in clients)}, partial-success rejected spans "
        f"{sum(c.stats.rejected_spans for c in clients)}"
    )
    print(
        f"RSS MiB: start {rss0:.1f}, min {min(rss, default=0):.1f}, max {max(rss, default=0):.1f}, "
        f"first-fifth median {statistics.median(rss[:k]) if rss else 0:.1f}, last-fifth median "
        f"{statistics.median(rss[-k:]) if rss else 0:.1f}"
    )
    print(
        f"anonymous MiB (RssAnon): min {min(anon, default=0):.1f}, max {max(anon, default=0):.1f}, "
        f"growth {anon_growth:.1f}; file-backed MiB (RssFile): min "
        f"{min(file_backed, default=0):.1f}, max {max(file_backed, default=0):.1f}, growth "
        f"{_growth(file_backed):.1f}"
    )
    print(
        f"spool backlog max {backlog_max / 1024:.0f} KiB; serve stored {final['stored']} spans, "
        f"store_errors {final['store_errors']}; serve exit code {code}"
    )
    print(
        f"acknowledged span ids {len(acked_set)}, stored {stored_acked}, missing {missing}, "
        f"duplicate rows {duplicates}, stored but never acknowledged {unacked_stored}"
    )
    extra = ""
    if run.holds:
        print(f"holds of {args.hold_s:.0f} s (spans/s, share of the burst capacity "
              f"{capacity:,.0f} spans/s, verdict):")  # fmt: skip
        for h in run.holds:
            print(f"  {h.rate:10,.0f}  {h.rate / capacity:.2f}  "
                  f"{'held' if h.verdict.holds else 'did not hold'}: {h.verdict.why}")  # fmt: skip
        best = sustained(run.holds)
        print(f"sustained rate: {best:,.0f} spans/s = {best / capacity:.2f} of the burst capacity"
              if best else "sustained rate: none of the rates tried held")  # fmt: skip
        extra = f" sustained_spans_per_s={best or 0:.0f} capacity_spans_per_s={capacity:.0f}"
    verdict = "within" if anon_growth <= args.rss_bound_mb else "OVER"
    print(
        f"anonymous memory growth {anon_growth:.1f} MiB (RSS {growth:.1f} MiB): {verdict} the "
        f"bound of {args.rss_bound_mb:.0f} MiB"
    )
    print(
        f"RESULT acked={len(acked_set)} stored={stored_acked} duplicates={duplicates} "
        f"rss_growth_mb={growth:.1f} rss_bound_mb={args.rss_bound_mb:.0f} missing={missing} backpressure={statuses[429] + statuses[503]} "
        f"errors={dropped} rate={rate:.0f} achieved={soak_acked / elapsed:.0f} "
        f"duration_s={elapsed:.0f} anon_growth_mb={anon_growth:.1f} "
        f"anon_max_mb={max(anon, default=0):.1f}{extra}"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
