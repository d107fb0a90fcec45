"""End-to-end ingest throughput: OTLP/protobuf requests of 5,000 transition spans -> serve
(embedded chDB, spool fsync on) -> stored; and, in the same run, protobuf parsing alone.

Prints figures and a last line
`RESULT spans_per_s=<e2e> parse_ratio=<e2e/parse> rss_mb=<serve peak RSS> anon_mb=<serve peak
anonymous memory>`. anon_mb is the memory serve itself holds (RssAnon, sampled every 10 ms
from the warm-up to the last span stored): what other processes cannot get back. rss_mb
(VmHWM) also counts file-backed pages (RssFile: mostly the chDB library's code, shared with
the page cache and reclaimable) and RssShmem; those are printed apart.
e2e is measured from the first request sent to the moment serve reports nothing queued
(every span in otel_traces, handoff_transitions, transition_ledger). Sizes are flags.

`--transport grpc` sends the same serialized requests, with the same concurrency, to serve's
OTLP/gRPC port (TraceService/Export; one channel per sender, as one HTTP connection per
sender), each round also running them over HTTP on a fresh serve, and adds
` http_spans_per_s=<e2e over HTTP> grpc_vs_http=<ratio>` to RESULT (spans_per_s is gRPC's).

Ratios in one run (bench/_paired.py: the two sides alternate which goes first, --rounds
rounds, each round's figures and ratio printed, then the median ratio): `--baseline-tree REF`
runs the same requests against a serve running REF's code (a git worktree of REF in a temp
dir, with this virtualenv), last line `RESULT vs_baseline=<this / REF end to end>
cpu_vs_baseline=<serve CPU ratio> ...`; `--compare-spans 512,5000` sends the same spans as
requests of 512 and of 5,000 spans, last line `RESULT small_vs_large=<ratio> ...`.

    .venv/bin/python bench/ingest_throughput.py --requests 20 --spans 5000 --concurrency 2
    .venv/bin/python bench/ingest_throughput.py --transport grpc --no-baseline
    .venv/bin/python bench/ingest_throughput.py --baseline-tree HEAD --rounds 3
    .venv/bin/python bench/ingest_throughput.py --compare-spans 512,5000 --rounds 3
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from bench._paired import versus_sizes, versus_tree
from ingest import decode_protobuf
from ingest.testing import key_value
from serve.procstat import (
    MEMORY_FIELDS,
    MemorySampler,
    cpu_s,
    cpu_ticks,
    machine_note,
    peak_rss_mb,
    thread_cpu_s,
)
from serve.testing import start_serve

_STEPS = [
    ("create", "", "created"),
    ("accept", "created", "accepted"),
    ("start", "accepted", "running"),
    ("commit", "running", "committed"),
    ("verify", "committed", "verified"),
]


def build_request(rng: random.Random, n_spans: int, base_ns: int) -> bytes:
    """One request of n_spans handoff transitions (5 per handoff), realistic attributes."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [key_value("service.name", "agent-b"), key_value("host.name", "bench")]
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "handoffs.collector"
    ss.scope.version = "0.1.0"
    for i in range(n_spans):
        h, step = divmod(i, len(_STEPS))
        event, frm, to = _STEPS[step]
        sp = ss.spans.add()
        sp.trace_id = rng.randbytes(16)
        sp.span_id = rng.randbytes(8)
        sp.parent_span_id = rng.randbytes(8)
        sp.name = f"handoff.{event}"
        sp.kind = 1
        sp.start_time_unix_nano = base_ns + i * 1000
        sp.end_time_unix_nano = sp.start_time_unix_nano + 500
        hid = f"h-{base_ns}-{h}"
        attrs = [
            ("handoff.task_id", f"task-{h // 2}"),
            ("handoff.handoff_id", hid),
            ("handoff.event", event),
            ("handoff.from_state", frm),
            ("handoff.to_state", to),
            ("handoff.actor", "agent-b"),
            ("gen_ai.agent.name", "agent-b"),
        ]
        if event == "create":
            attrs += [
                ("handoff.protocol", "aa-handoff/v1"),
                ("handoff.mode", "delegate"),
                ("handoff.from_agent", "agent-a"),
                ("handoff.to_agent", "agent-b"),
                ("handoff.deadline_ms", 60_000),
            ]
        if event == "commit":
            attrs += [("handoff.evidence.count", 2), ("handoff.evidence.valid", True)]
        sp.attributes.extend(key_value(k, v) for k, v in attrs)
    return req.SerializeToString()


_WARM_SPANS = 1000


#: the ingest targets (end-to-end spans/s, serve's peak anonymous memory in MB: what serve
#: holds, not the chDB library's shared, reclaimable file pages), for the summary of several
#: rounds (--rounds)
_TARGET_SPANS_S: Final = 50_000
_TARGET_ANON_MB: Final = 500

#: serve's threads by name (Linux comm; ClickHouse names its own threads): what each group does
_THREAD_ROLES: Final = {
    "QueryPipelineEx": "decoding streams",
    "ThreadPool": "chDB connections (writes, staging)",
    "python": "Python (stager, writer, stream readers)",
    "MergeMutate": "merges",
}


def _cpu_split(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], total: float
) -> str:
    """serve's CPU over the run (`total`) by thread role; chDB runs a connection's queries
    on a worker thread of its own. Threads gone by the end count as "ended": the senders'
    HTTP connection threads (reading bodies, hashing, spooling: ~0.15 s per 100,000 spans)
    and engine pool threads that exited."""
    split: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        role = _THREAD_ROLES.get(name, "other")
        split[role] = split.get(role, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    split["ended"] = max(0.0, total - sum(split.values()))
    return ", ".join(
        f"{role} {cpu:.2f} s" for role, cpu in sorted(split.items(), key=lambda x: -x[1])
    )


#: one sender's connection: send(body) -> None when acknowledged, else what went wrong;
#: close() when done
Sender = tuple[Callable[[bytes], str | None], Callable[[], None]]


def _http_sender(serve) -> Sender:
    """POST /v1/traces on one keep-alive connection."""
    url = f"{serve.otlp_url}/v1/traces"
    s = requests.Session()

    def send(body: bytes) -> str | None:
        r = s.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=300)
        return None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"

    return send, s.close


def _grpc_sender(serve) -> Sender:
    """TraceService/Export on one channel (one HTTP/2 connection), the serialized request
    sent as it is (no serializer: the same bytes as over HTTP)."""
    import grpc

    from ingest._otlp_grpc import METHOD, SERVICE

    channel = grpc.insecure_channel(serve.grpc_target)
    export = channel.unary_unary(
        f"/{SERVICE}/{METHOD}", request_serializer=None, response_deserializer=None
    )

    def send(body: bytes) -> str | None:
        try:
            export(body, timeout=300)
        except grpc.RpcError as exc:
            return f"{exc.code().name} {exc.details()[:200]}"
        return None

    return send, channel.close


_SENDERS: Final = {"http": _http_sender, "grpc": _grpc_sender}


def _e2e(
    bodies: list[bytes],
    args: argparse.Namespace,
    base: int,
    decoder: str,
    transport: str = "http",
    *,
    env: dict[str, str] | None = None,
    label: str = "",
) -> dict | None:
    """One serve run with `decoder`, the requests sent over `transport` (http or grpc), serve
    started with `env` added to its environment (another tree's code: bench._paired);
    prints its figures, returns them (None on errors)."""
    total = args.requests * args.spans
    print(f"\n--- serve --decoder {decoder}, OTLP/{transport}{f' ({label})' if label else ''}")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        serve = start_serve(
            Path(tmp),
            extra_args=("--decoder", decoder),
            env=env,
            grpc_port=None if transport == "grpc" else 0,  # no gRPC server unless sent over it
        )
        try:
            with MemorySampler(serve.process.pid) as sampler:
                connect = _SENDERS[transport]
                # warm-up request (schema parts, first insert, the chDB decoder's first query)
                # not counted: 1,000 spans (~350 KB), which `auto` always sends to chDB
                # (bodies of SQL_MIN_BYTES, 256 KiB, and more)
                warm = build_request(random.Random(999), _WARM_SPANS, base - 10**12)
                send, close = connect(serve)
                warm_error = send(warm)
                close()
                if warm_error:
                    print("warm-up request refused:", warm_error)
                    return None
                serve.wait_stored(120)
                queue = list(bodies)
                lock = threading.Lock()
                errors: list[str] = []
                # made before the clock starts; a session and a channel both connect on their
                # first request, in the measured time
                connections = [connect(serve) for _ in range(args.concurrency)]

                def sender(send: Callable[[bytes], str | None]) -> None:
                    while True:
                        with lock:
                            if not queue:
                                return
                            body = queue.pop()
                        error = send(body)
                        if error:
                            errors.append(error)

                cpu0 = cpu_s(serve.process.pid)
                threads0 = thread_cpu_s(serve.process.pid)
                ticks0 = cpu_ticks()
                t0 = time.perf_counter()
                threads = [threading.Thread(target=sender, args=(c[0],)) for c in connections]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                acked = time.perf_counter() - t0
                for _, close in connections:
                    close()
                # serve answers /health?wait_s= once the last acknowledged request is stored
                # (polling /health every 10 ms instead took ~1 ms of serve's CPU and a new
                # connection and thread each time, in the busiest part of the run)
                health = serve.wait_stored(600, poll_s=0.01)
                e2e_s = time.perf_counter() - t0
                cpu = cpu_s(serve.process.pid) - cpu0
                split = _cpu_split(threads0, thread_cpu_s(serve.process.pid), cpu)
                machine = machine_note(ticks0, cpu_ticks())
                if errors:
                    print("errors:", errors[:3])
                    return None
                ch = serve.client()
                stored = ch.query("SELECT count() FROM handoff_transitions").result_rows[0][0]
                ch.close()
                rss = peak_rss_mb(serve.process.pid)
            anon, rss_file, shmem = (sampler.peak_mb(f) for f in MEMORY_FIELDS)
        finally:
            serve.stop()
    e2e = total / e2e_s
    print(f"acknowledged (spooled+fsync): {total / acked:10,.0f} spans/s")
    print(f"end to end (stored):        {e2e:12,.0f} spans/s  ({total} spans in {e2e_s:.2f} s)")
    print(
        f"serve CPU: {cpu:.2f} s -> {total / cpu:,.0f} spans per CPU-second (machine load not counted)"
    )
    print(f"serve CPU by thread: {split}")
    print(machine)
    print(f"stored transitions: {stored - _WARM_SPANS} of {total}; {health['batches']} batches")
    print(
        f"serve peak memory: anonymous {anon:.0f} MB (RssAnon); file-backed {rss_file:.0f} MB "
        f"(RssFile: mostly the chDB library), shared {shmem:.0f} MB (RssShmem); "
        f"RSS {rss:.0f} MB (VmHWM, all three at once)"
    )
    print(
        "serve stage seconds (wall, overlapping):",
        {k: health[k] for k in ("decode_s", "spool_s", "queue_wait_s", "store_s")},
        f"writes {health['writes']}, overlapped {health.get('overlapped_writes', 0)}, "
        f"overlaps skipped for memory {health.get('overlaps_skipped_for_memory', 0)}",
    )
    print(
        f"requests decoded by chDB: {health['sql_decoded']} in {health['sql_decode_queries']} "
        f"queries, {health.get('sql_decode_rounds', 0)} round trips "
        f"({health['sql_decoded'] / max(health.get('sql_decode_rounds', 0), 1):.1f} requests "
        f"per round), declined: {health['sql_declined']}"
    )
    return {
        "e2e": total / e2e_s,
        "acked": total / acked,
        "cpu_s": cpu,
        "rss": rss,
        "anon": anon,
        "file": rss_file,
        "health": health,
    }


def _two_sizes(text: str) -> tuple[int, int]:
    """'SMALL,LARGE' spans per request (argparse type)."""
    try:
        small, large = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"want SMALL,LARGE spans per request, got {text!r}"
        ) from None
    if not 0 < small < large:
        raise argparse.ArgumentTypeError(f"want 0 < SMALL < LARGE, got {small},{large}")
    return small, large


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20, help="requests to send (default 20)")
    ap.add_argument("--spans", type=int, default=5000, help="spans per request (default 5000)")
    ap.add_argument("--concurrency", type=int, default=2, help="parallel senders (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--decoder",
        default="auto",
        choices=("auto", "sql", "python"),
        help="serve --decoder of the measured run (default auto)",
    )
    ap.add_argument(
        "--transport",
        default="http",
        choices=("http", "grpc"),
        help="grpc: the measured runs send over OTLP/gRPC, and each round also over HTTP "
        "(a fresh serve each) for the ratio of the two (default http)",
    )
    ap.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the baseline run with --decoder python",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measured runs, each with a fresh serve (default 1); with more, RESULT is the "
        "median round's and a summary line gives the spread (this machine's speed varies "
        "by ~30%% between runs)",
    )
    ap.add_argument(
        "--baseline-tree",
        metavar="REF",
        help="instead: the same requests against a serve running REF's code (a git worktree "
        "made in a temp dir, this virtualenv), alternating which goes first, --rounds rounds; "
        "prints each round's figures and ratio (this tree / REF) and the median ratio",
    )
    ap.add_argument(
        "--compare-spans",
        metavar="SMALL,LARGE",
        type=_two_sizes,
        help="instead: the same spans (--requests x --spans in all) as requests of SMALL and of "
        "LARGE spans (e.g. 512,5000), alternating, --rounds rounds; prints the ratio SMALL / LARGE",
    )
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.baseline_tree and args.compare_spans:
        ap.error("--baseline-tree and --compare-spans are two runs of their own: pick one")
    if args.compare_spans:
        return versus_sizes(args, build_request, _e2e)

    rng = random.Random(args.seed)
    base = time.time_ns()
    bodies = [build_request(rng, args.spans, base + k * 10**9) for k in range(args.requests)]
    total = args.requests * args.spans
    print(
        f"{args.requests} requests x {args.spans} spans, {sum(map(len, bodies)) / 1e6:.1f} MB protobuf"
    )
    if args.baseline_tree:
        return versus_tree(args, bodies, base, _e2e)

    t = time.perf_counter()
    for b in bodies:
        ExportTraceServiceRequest.FromString(b)
    parse_s = time.perf_counter() - t
    parse_rate = total / parse_s
    print(f"protobuf parse only:        {parse_rate:12,.0f} spans/s")

    t = time.perf_counter()
    for b in bodies[: max(1, len(bodies) // 4)]:
        decode_protobuf(b, tenant="default")
    n_dec = max(1, len(bodies) // 4) * args.spans
    decode_rate = n_dec / (time.perf_counter() - t)
    print(f"decode+validate+hash only:  {decode_rate:12,.0f} spans/s (in this process)")

    base_run = _e2e(bodies, args, base, "python") if args.baseline else None
    runs: list[dict | None] = []
    http_runs: list[dict | None] = []
    for i in range(args.rounds):
        if args.transport == "grpc":
            # HTTP first in even rounds, gRPC first in odd ones: a drift in the machine's
            # speed over the run (neighbours' load) does not favour one transport
            pair = ("http", "grpc") if i % 2 == 0 else ("grpc", "http")
            got = {t: _e2e(bodies, args, base, args.decoder, t) for t in pair}
            runs.append(got["grpc"])
            http_runs.append(got["http"])
        else:
            runs.append(_e2e(bodies, args, base, args.decoder))
    if any(r is None for r in [*runs, *http_runs]) or (args.baseline and base_run is None):
        return 1
    done = sorted((r for r in runs if r is not None), key=lambda r: r["e2e"])
    run = done[len(done) // 2]  # the median round (upper median for an even count)
    if len(done) > 1:
        met = sum(1 for r in done if r["e2e"] >= _TARGET_SPANS_S and r["anon"] <= _TARGET_ANON_MB)

        def spread(key: str) -> str:
            v = sorted(r[key] for r in done)
            return f"{v[0]:.0f} / {v[len(v) // 2]:.0f} / {v[-1]:.0f} MB"

        print(
            f"\n{len(done)} rounds: end to end {done[0]['e2e']:,.0f} / {run['e2e']:,.0f} / "
            f"{done[-1]['e2e']:,.0f} spans/s (min / median / max), peak anonymous memory "
            f"{spread('anon')}, peak file-backed {spread('file')}, peak RSS {spread('rss')}; "
            f"{met} of {len(done)} rounds met both targets (>= {_TARGET_SPANS_S:,} spans/s "
            f"and <= {_TARGET_ANON_MB} MB of anonymous memory in the same round)"
        )
    e2e, rss, anon = run["e2e"], run["rss"], run["anon"]
    ratio = f" vs_python={e2e / base_run['e2e']:.2f}" if base_run else ""
    if http_runs:
        http = sorted((r for r in http_runs if r is not None), key=lambda r: r["e2e"])
        h = http[len(http) // 2]  # the median HTTP round, as `run` is the median gRPC one
        print(
            f"\nOTLP/gRPC vs OTLP/HTTP in this run ({len(http)} round(s) each, medians): "
            f"end to end {e2e:,.0f} vs {h['e2e']:,.0f} spans/s = {e2e / h['e2e']:.2f}x; "
            f"acknowledged {run['acked']:,.0f} vs {h['acked']:,.0f} spans/s = "
            f"{run['acked'] / h['acked']:.2f}x; serve CPU {run['cpu_s']:.2f} vs "
            f"{h['cpu_s']:.2f} s (load-independent); peak RSS {rss:.0f} vs {h['rss']:.0f} MB"
        )
        ratio += f" http_spans_per_s={h['e2e']:.0f} grpc_vs_http={e2e / h['e2e']:.2f}"
    if base_run:
        print(
            f"\n{args.decoder} decoder vs python decoder in this run: {e2e / base_run['e2e']:.2f}x"
        )
    print(
        f"RESULT spans_per_s={e2e:.0f} parse_ratio={e2e / parse_rate:.4f} rss_mb={rss:.0f} "
        f"anon_mb={anon:.0f}{ratio}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
