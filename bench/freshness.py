"""Freshness: how long after a span's HTTP 200 its handoff is counted by the funnel and by
the anomalies, read through serve's query port, under a steady ingest load near capacity.

One `handoffs serve` (embedded chDB, spool fsync on, two bearer tokens: a load tenant and a
probe tenant). First a calibration measures what serve sustains end to end (spans/s stored
while --clients senders post as fast as they can for --calibrate-s seconds, with the two
pollers below already asking: a short burst, before merges start and without the queries,
overstates it about twofold); then --clients threads post OTLP/protobuf requests of --spans
handoff transitions (5 per handoff, as the shim sends them: its instrumentation scope (or
--scope), every handoff in a trace of its own, every request's handoffs and traces new) at
--load x that rate (or at --rate spans/s, without the calibration), evenly paced, for
--duration seconds. Meanwhile a probe client posts one handoff every --probe-ms: `create`
then `start` without `accept` in one request (an implied_accept anomaly), its own to_agent
so the funnel counts it apart. Two pollers, each every --poll-ms, ask the query port what
an SRE's page would: analytics.funnel(by to_agent) of the probe tenant (a probe is counted
once its slice has volume 1) and analytics.anomaly_handoff_ids(implied_accept). A probe's
freshness is the time from its 200 to the end of the first poll that counts it: an upper
bound, too high by at most one poll period plus one query (their medians are printed).
Where in that span it became countable is printed too: after the start of the last poll
that missed it, by about the start of the first that counted it. After the load stops the
pollers keep going until every probe is counted (or --settle-s passes: the rest are
reported unseen).

The load is stated as a share of serve's sustained rate (`bench/soak.py --find-sustained`:
the highest rate its merges keep up with, well below the burst capacity the calibration
measures), given as --sustained-rate N spans/s: then --load is a share of it (no
calibration), and "load = x.xx of sustained" is printed from the load achieved.

Last line: `RESULT freshness_p50_ms=<n> freshness_p99_ms=<n> anomalies_p50_ms=<n>
anomalies_p99_ms=<n> load_spans_per_s=<n> capacity_spans_per_s=<n> probes=<n> unseen=<n>
load_of_sustained=<x.xx, nan without --sustained-rate>`. Target: freshness p99 <= 1,000 ms.

    .venv/bin/python bench/freshness.py                      # 60 s at 80 % of capacity
    .venv/bin/python bench/freshness.py --duration 10 --load 0.5 --clients 2
    .venv/bin/python bench/freshness.py --duration 30 --rate 20000   # a fixed load, to compare
    .venv/bin/python bench/freshness.py --sustained-rate 9000 --load 0.8   # 80 % of sustained
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from analytics import Window, anomaly_handoff_ids, funnel
from collector.tracer import INSTRUMENTATION_NAME
from ingest.testing import key_value
from serve.procstat import cpu_s
from serve.testing import start_serve

TOKENS: Final = {"tok-load": "load", "tok-probe": "probe"}
PROBE_KIND: Final = "implied_accept"
#: the part of every load handoff id a request replaces (same length: the protobuf framing
#: stays valid)
MARK: Final = b"ffffffffffffffff"
#: the first half of every load trace id, which a request replaces (8 bytes: its number), so
#: every handoff has a trace of its own as the shim's spans do
TRACE_MARK: Final = b"\xfe" * 8
_STEPS: Final = (
    ("create", "", "created"),
    ("accept", "created", "accepted"),
    ("start", "accepted", "running"),
    ("commit", "running", "committed"),
    ("verify", "committed", "verified"),
)


def _request(
    spans: Sequence[tuple[str, str, str, str, str, int]],
    trace_high: bytes,
    scope: str = INSTRUMENTATION_NAME,
) -> bytes:
    """One OTLP request in instrumentation scope `scope`; spans as (handoff_id, event, from,
    to, to_agent, time ns), root spans named `handoff.<event>`, each handoff's spans in trace
    `trace_high` + its number."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(key_value("service.name", "bench-freshness"))
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    for n, (hid, event, frm, to, to_agent, at) in enumerate(spans):
        sp = ss.spans.add()
        sp.trace_id = trace_high + (n // 5 + 1).to_bytes(8, "big")
        sp.span_id = (n + 1).to_bytes(8, "big")
        sp.name = f"handoff.{event}"
        sp.kind = 1
        sp.start_time_unix_nano = at
        sp.end_time_unix_nano = at + 500
        attrs: list[tuple[str, object]] = [
            ("handoff.task_id", f"task-{hid}"),
            ("handoff.handoff_id", hid),
            ("handoff.event", event),
            ("handoff.from_state", frm),
            ("handoff.to_state", to),
            ("handoff.actor", to_agent if event != "create" else "planner"),
        ]
        if event == "create":
            attrs += [("handoff.protocol", "aa-handoff/v1"), ("handoff.mode", "delegate"),
                      ("handoff.from_agent", "planner"), ("handoff.to_agent", to_agent),
                      ("handoff.deadline_ms", 60_000)]  # fmt: skip
        if event == "commit":
            attrs += [("handoff.evidence.count", 1), ("handoff.evidence.valid", True)]
        sp.attributes.extend(key_value(k, v) for k, v in attrs)
    return req.SerializeToString()


def load_template(n_spans: int, at_ns: int, scope: str = INSTRUMENTATION_NAME) -> bytes:
    """A request of n_spans transitions (5 per handoff) whose handoff ids hold MARK, in
    instrumentation scope `scope`."""
    spans = []
    for i in range(n_spans):
        h, step = divmod(i, len(_STEPS))
        event, frm, to = _STEPS[step]
        spans.append((f"h-{MARK.decode()}-{h}", event, frm, to, "worker", at_ns + i * 1000))
    return _request(spans, TRACE_MARK, scope)


def stamp(template: bytes, k: int) -> bytes:
    """The template with request number k in every handoff id and trace id (new handoffs in
    new traces each time)."""
    return template.replace(MARK, b"%016x" % k).replace(TRACE_MARK, k.to_bytes(8, "big"))


def probe_id(i: int) -> str:
    return f"probe-{i:06d}"


def probe_request(i: int, at_ns: int) -> bytes:
    """Probe i: created, then started without an accept (implied_accept); to_agent = its id."""
    hid = probe_id(i)
    create = (hid, "create", "", "created", hid, at_ns)
    start = (hid, "start", "accepted", "running", hid, at_ns + 1_000_000)
    return _request([create, start], (2**63 + i).to_bytes(8, "big"))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def freshness_ms(acked: dict[int, float], seen: dict[int, float]) -> tuple[list[float], int]:
    """Per probe acknowledged and seen: milliseconds from its 200 to the poll that counted it
    (sorted by probe); plus how many acknowledged probes were never seen."""
    ms = [(seen[i] - acked[i]) * 1000 for i in sorted(acked) if i in seen]
    return ms, sum(1 for i in acked if i not in seen)


def bracket(
    acked: dict[int, float], polls: Sequence[tuple[float, float, frozenset[int]]]
) -> tuple[list[float], list[float]]:
    """Where each counted probe became countable, from the polls (start, end, probes counted;
    in order): milliseconds from its 200 to the start of the last poll that did not count it
    yet (0 when none started after the 200), and to the start of the first poll that did.
    The first is a lower bound; the second an upper bound but for the query's own planning
    before the store is read. (freshness_ms is the strict upper bound: the first poll's end.)"""
    before: list[float] = []
    first: list[float] = []
    for i in sorted(acked):
        at, miss = acked[i], acked[i]
        for t0, _t1, got in polls:
            if i in got:
                before.append((miss - at) * 1000)
                first.append((max(t0, at) - at) * 1000)
                break
            if t0 >= at:
                miss = t0
    return before, first


def prom_values(text: str, prefix: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition whose name starts with `prefix` (names
    without labels), as {name: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix) and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def schedule(start: float, interval: float, offset: float, n: int) -> list[float]:
    """Send times of one paced sender: start + offset + k * interval, k < n."""
    if interval <= 0:
        raise ValueError(f"interval must be > 0, got {interval}")
    return [start + offset + k * interval for k in range(n)]


def _session(token: str, url: str) -> Callable[[bytes], int]:
    """POST bodies to url on one keep-alive connection; returns the status code."""
    s = requests.Session()
    s.headers.update({"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"})

    def post(body: bytes) -> int:
        return s.post(url, data=body, timeout=120).status_code

    return post


class _Poller(threading.Thread):
    """Every poll_s: fn() -> the probe numbers counted now; records when each was first seen
    (the end of the query), each query's duration and every poll (start, end, counted)."""

    def __init__(self, name: str, fn: Callable[[], set[int]], poll_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.fn, self.poll_s = fn, poll_s
        self.seen: dict[int, float] = {}
        self.query_s: list[float] = []
        self.polls: list[tuple[float, float, frozenset[int]]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                got = self.fn()
            except Exception as exc:  # a query refused under load is a figure, not a crash
                self.errors.append(" ".join(str(exc).split())[:200])
                got = set()
            t1 = time.perf_counter()
            self.query_s.append(t1 - t0)
            self.polls.append((t0, t1, frozenset(got)))
            for i in got:
                self.seen.setdefault(i, t1)
            self.stop.wait(max(0.0, self.poll_s - (t1 - t0)))


def _blast(url: str, template: bytes, clients: int, seconds: float, first: int) -> tuple[int, int]:
    """Send stamped requests from `clients` threads as fast as they go, until `seconds` have
    passed (at least one request); returns (requests sent, refused)."""
    end = time.perf_counter() + seconds
    counter = iter(range(first, 2**62))
    lock = threading.Lock()
    bad: list[int] = []
    sent: list[int] = []

    def run() -> None:
        post = _session("tok-load", url)
        while True:
            with lock:
                if sent and time.perf_counter() >= end:
                    return
                k = next(counter)
                sent.append(k)
            code = post(stamp(template, k))
            if code != 200:
                bad.append(code)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(sent), len(bad)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--duration", type=float, default=60.0, help="load seconds (default 60)")
    ap.add_argument("--clients", type=int, default=8, help="load senders (default 8)")
    ap.add_argument("--spans", type=int, default=1000, help="spans per load request (default 1000)")
    ap.add_argument("--load", type=float, default=0.8, help="fraction of capacity (default 0.8)")
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="load in spans/s instead of --load x the calibrated capacity (no calibration): "
        "the same load for runs compared with each other",
    )
    ap.add_argument(
        "--sustained-rate",
        type=float,
        default=None,
        help="serve's sustained rate, spans/s (bench/soak.py --find-sustained): --load is then "
        "a share of it, without calibration, and the load is printed as a share of it",
    )
    ap.add_argument(
        "--calibrate-s", type=float, default=20.0, help="calibration seconds (default 20)"
    )
    ap.add_argument(
        "--scope",
        default=INSTRUMENTATION_NAME,
        help="instrumentation scope of the load's spans (default: the shim's); another "
        "exporter's, e.g. an OTel SDK's in Node, to see what serve does with its transitions",
    )
    ap.add_argument("--probe-ms", type=float, default=200.0, help="probe period (default 200)")
    ap.add_argument("--poll-ms", type=float, default=50.0, help="poll period (default 50)")
    ap.add_argument(
        "--settle-s", type=float, default=30.0, help="wait for late probes (default 30)"
    )
    args = ap.parse_args(argv)
    for name in ("duration", "load", "probe_ms", "poll_ms", "calibrate_s"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.rate is not None and args.rate <= 0:
        ap.error("--rate must be > 0 spans/s")
    if args.sustained_rate is not None and args.sustained_rate <= 0:
        ap.error("--sustained-rate must be > 0 spans/s")
    if args.clients < 1 or args.spans < 5:
        ap.error("--clients >= 1 and --spans >= 5 required")

    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        serve = start_serve(Path(tmp), ",".join(f"{t}={n}" for t, n in TOKENS.items()))
        try:
            return _run(args, serve)
        finally:
            serve.stop()


def _run(args: argparse.Namespace, serve) -> int:
    url = f"{serve.otlp_url}/v1/traces"
    template = load_template(args.spans, time.time_ns(), args.scope)
    # warm-up (schema parts, first insert), the pollers, then the calibration
    _blast(url, template, 1, 0.0, 0)
    serve.wait_stored(120)

    now = datetime.now(UTC)
    window = Window(start=now - timedelta(hours=1), end=now + timedelta(hours=2))
    client_f, client_a = serve.client(), serve.client()

    def counted_by_funnel() -> set[int]:
        df = funnel(client_f, database=serve.database, window=window, tenant="probe",
                    by=("to_agent",))  # fmt: skip
        return {int(a.rsplit("-", 1)[1]) for a, v in zip(df["to_agent"], df["volume"], strict=True)
                if v and str(a).startswith("probe-")}  # fmt: skip

    def counted_by_anomalies() -> set[int]:
        ids = anomaly_handoff_ids(client_a, database=serve.database, window=window,
                                  kind=PROBE_KIND, tenant="probe", limit=10**6)  # fmt: skip
        return {int(h.rsplit("-", 1)[1]) for h in ids if h.startswith("probe-")}

    pollers = [_Poller("funnel", counted_by_funnel, args.poll_ms / 1000),
               _Poller("anomalies", counted_by_anomalies, args.poll_ms / 1000)]  # fmt: skip
    for p in pollers:
        p.start()

    if args.rate is None and args.sustained_rate is not None:
        capacity, rate = math.nan, args.load * args.sustained_rate
        print(f"load asked: {args.load:.2f} x the sustained {args.sustained_rate:,.0f} spans/s = "
              f"{rate:,.0f} spans/s (no calibration)")  # fmt: skip
    elif args.rate is None:
        t0 = time.perf_counter()
        n_cal, refused = _blast(url, template, args.clients, args.calibrate_s, 1)
        serve.wait_stored(600, poll_s=0.01)
        capacity = n_cal * args.spans / (time.perf_counter() - t0)
        rate = args.load * capacity
        print(f"capacity (calibration: {n_cal} x {args.spans} spans in {args.calibrate_s:.0f} s "
              f"from {args.clients} senders, pollers asking): {capacity:,.0f} spans/s stored; "
              f"{refused} refused")  # fmt: skip
    else:
        capacity, rate = math.nan, args.rate
        print(f"load asked: {rate:,.0f} spans/s (--rate; no calibration)")

    interval = args.clients * args.spans / rate  # each sender's period
    n_each = max(1, int(args.duration / interval))
    start = time.perf_counter() + 0.2
    sent = [0] * args.clients
    bad: list[int] = []
    late: list[float] = []

    def sender(c: int) -> None:
        post = _session("tok-load", url)
        for k, at in enumerate(schedule(start, interval, c * interval / args.clients, n_each)):
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # pacing, not waiting for a state
            else:
                late.append(-wait)
            code = post(stamp(template, 10**6 * (c + 1) + k))
            sent[c] += 1
            if code != 200:
                bad.append(code)

    acked: dict[int, float] = {}
    probe_bad: list[int] = []

    def prober() -> None:
        post = _session("tok-probe", url)
        period = args.probe_ms / 1000
        n_probes = max(1, int((n_each * interval - 0.05) / period))
        for i, at in enumerate(schedule(start, period, 0.05, n_probes)):
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            code = post(probe_request(i, time.time_ns()))
            if code == 200:
                acked[i] = time.perf_counter()
            else:
                probe_bad.append(code)

    def settles() -> dict[str, float]:  # and the derivation passes' counters
        text = requests.get(f"{serve.otlp_url}/metrics", timeout=30).text
        return prom_values(text, "handoffs_settle_") | prom_values(text, "handoffs_derive_")

    settle0 = settles()
    cpu0 = cpu_s(serve.process.pid)
    h0 = serve.health()
    writes0, store0 = int(h0.get("writes", 0)), float(h0.get("store_s", 0.0))
    threads = [threading.Thread(target=sender, args=(c,)) for c in range(args.clients)]
    threads.append(threading.Thread(target=prober))
    queued_max = 0
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        queued_max = max(queued_max, int(serve.health().get("queued", 0)))
        threads[-1].join(1.0)
    for t in threads:
        t.join()
    load_s = time.perf_counter() - start
    serve_cores = (cpu_s(serve.process.pid) - cpu0) / load_s
    settle1 = settles()
    deadline = time.perf_counter() + args.settle_s
    while time.perf_counter() < deadline and not all(set(acked) <= set(p.seen) for p in pollers):
        pollers[0].stop.wait(0.1)
    for p in pollers:
        p.stop.set()
        p.join()
    client_f.close()
    client_a.close()

    load_spans = sum(sent) * args.spans / load_s
    of = "sustained" if args.sustained_rate else "capacity"
    asked = "--rate" if args.rate else f"{args.load:.0%} of {of}"
    print(f"load: {sum(sent)} requests x {args.spans} spans in {load_s:.1f} s = {load_spans:,.0f} "
          f"spans/s ({asked} asked), {len(bad)} refused, {len(late)} sent "
          f"late (max {max(late, default=0) * 1000:.0f} ms); serve queue max {queued_max}")  # fmt: skip
    share = load_spans / args.sustained_rate if args.sustained_rate else math.nan
    print(f"load = {share:.2f} of sustained ({args.sustained_rate:,.0f} spans/s)" if args.sustained_rate
          else "load = ? of sustained: give --sustained-rate (bench/soak.py --find-sustained)")  # fmt: skip
    print(f"probes: {len(acked)} acknowledged, {len(probe_bad)} refused")
    n_settles = settle1.get("handoffs_settle_settles_total", 0) - settle0.get(
        "handoffs_settle_settles_total", 0
    )
    print(f"serve's CPU during the load: {serve_cores:.2f} cores")
    print(f"serve's settle thread during the load: {n_settles:.0f} settles of "
          f"{settle1.get('handoffs_settle_handoffs_total', 0) - settle0.get('handoffs_settle_handoffs_total', 0):,.0f} "
          f"handoffs, the last {settle1.get('handoffs_settle_last_seconds', 0):.1f} s")  # fmt: skip
    print("serve's derivation passes during the load: "
          + ", ".join(f"{settle1.get(f'handoffs_derive_{k}_total', 0) - settle0.get(f'handoffs_derive_{k}_total', 0):,.0f} {k}"
                      for k in ("passes", "traces", "spans")) + " read")  # fmt: skip
    h = serve.health()
    writes = max(1, int(h.get("writes", 0)) - writes0)
    print(f"serve during the load: {writes} writes, {(sum(sent) + len(acked)) / writes:.1f} requests "
          f"and {(h.get('store_s', 0.0) - store0) / writes * 1000:.0f} ms each on average")  # fmt: skip
    figures: dict[str, float] = {}
    for p in pollers:
        ms, unseen = freshness_ms(acked, p.seen)
        q = sorted(p.query_s)
        print(f"{p.name}: {len(ms)} probes counted, {unseen} unseen; freshness p50 "
              f"{percentile(ms, 50) if ms else math.nan:.0f} ms, p99 "
              f"{percentile(ms, 99) if ms else math.nan:.0f} ms, max {max(ms, default=math.nan):.0f} ms; "
              f"{len(q)} polls, query p50 {percentile(q, 50) * 1000:.0f} ms, "
              f"p99 {percentile(q, 99) * 1000:.0f} ms; {len(p.errors)} failed "
              f"{p.errors[:1]}")  # fmt: skip
        before, first = bracket(acked, p.polls)
        if first:
            print(f"  countable between: the last poll not counting it started "
                  f"{percentile(before, 50):.0f} / {percentile(before, 99):.0f} ms after the 200 "
                  f"(p50 / p99), the first counting it {percentile(first, 50):.0f} / "
                  f"{percentile(first, 99):.0f} ms after; the rest is that poll's query")  # fmt: skip
        figures[f"{p.name}_p50"] = percentile(ms, 50) if ms else math.nan
        figures[f"{p.name}_p99"] = percentile(ms, 99) if ms else math.nan
        figures[f"{p.name}_unseen"] = unseen
    p99 = figures["funnel_p99"]
    print(f"target: funnel freshness p99 <= 1,000 ms: {'met' if p99 <= 1000 else 'NOT met'}")
    print(
        f"RESULT freshness_p50_ms={figures['funnel_p50']:.0f} freshness_p99_ms={p99:.0f} "
        f"anomalies_p50_ms={figures['anomalies_p50']:.0f} "
        f"anomalies_p99_ms={figures['anomalies_p99']:.0f} load_spans_per_s={load_spans:.0f} "
        f"capacity_spans_per_s={capacity:.0f} probes={len(acked)} "
        f"unseen={int(max(figures['funnel_unseen'], figures['anomalies_unseen']))} "
        f"load_of_sustained={share:.2f}"
    )
    return 0 if not bad and not probe_bad else 1


if __name__ == "__main__":
    sys.exit(main())
