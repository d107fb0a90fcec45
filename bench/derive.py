"""Handoff derivation in serve: delay from arrival to funnel, and serve's CPU per 1,000 spans.

Spans in the shape `openinference-instrumentation-openai-agents` exports (a workflow, the
source agent with its turn, model call and handoff span, the target agent with its turn and
model call: 9 spans per handoff) are sent over OTLP/HTTP protobuf to a real `handoffs serve`
(embedded chDB) in two requests per handoff, as batch processors split them: first the source
side, then the target side and the workflow.

1. Delay: `--handoffs` handoffs at `--rate` per second to a serve with derivation on (pass
   every HANDOFFS_DERIVE_EVERY_S, default 2 s). For each, from the moment serve acknowledged
   the request that completed it to the moment its derived `commit` is in handoff_transitions
   (the query port is polled every 50 ms). Prints p50/p95/max in seconds.
2. CPU: `--cpu-handoffs` handoffs sent as fast as serve takes them, once to a serve with
   `--no-derive` and once with derivation on (waiting until every commit is derived); serve's
   CPU seconds (utime + stime of the process) over the whole run, per 1,000 spans received,
   both ways, and the difference: what derivation costs.

Last line: `RESULT delay_p50_s=.. delay_p95_s=.. cpu_ms_per_1k_spans_derive=..
cpu_ms_per_1k_spans_base=.. derive_cpu_ms_per_1k_spans=..`

    .venv/bin/python bench/derive.py --handoffs 100 --rate 20 --cpu-handoffs 2000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from serve.testing import ServeHandle, start_serve, wait_until

SCOPE = "openinference.instrumentation.openai_agents"
RULE = "openinference.openai_agents.handoff"
MS = 1_000_000


def _span(tid: bytes, sid: int, parent: int, name: str, start: int, end: int, **attrs) -> Span:
    return Span(
        trace_id=tid,
        span_id=sid.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status=Status(code=Status.STATUS_CODE_OK),
        attributes=[
            KeyValue(key=k.replace("__", "."), value=AnyValue(string_value=v))
            for k, v in attrs.items()
        ],
    )


def handoff_requests(rng: random.Random, t0: int) -> tuple[bytes, bytes]:
    """(source side, target side + workflow) of one handoff, OTLP/protobuf."""
    tid = rng.randbytes(16)
    ids = iter(range(rng.getrandbits(40) << 8, (1 << 63)))
    root, wf, a, turn, gen, h, b, turn2, gen2 = (next(ids) for _ in range(9))
    kind = "openinference__span__kind"
    src = [
        _span(tid, a, wf, "planner", t0 + 1 * MS, t0 + 10 * MS, **{kind: "AGENT"},
              agent__name="planner", graph__node__id="planner"),
        _span(tid, turn, a, "turn", t0 + 2 * MS, t0 + 9 * MS, **{kind: "CHAIN"}),
        _span(tid, gen, turn, "generation", t0 + 2 * MS, t0 + 8 * MS, **{kind: "LLM"}),
        _span(tid, h, turn, "handoff to coder", t0 + 8 * MS, t0 + 9 * MS, **{kind: "TOOL"},
              input__value="planner", output__value="coder"),
    ]  # fmt: skip
    dst = [
        _span(tid, b, wf, "coder", t0 + 11 * MS, t0 + 20 * MS, **{kind: "AGENT"},
              agent__name="coder", graph__node__id="coder", graph__node__parent_id="planner"),
        _span(tid, turn2, b, "turn", t0 + 12 * MS, t0 + 19 * MS, **{kind: "CHAIN"}),
        _span(tid, gen2, turn2, "generation", t0 + 12 * MS, t0 + 18 * MS, **{kind: "LLM"}),
        _span(tid, wf, root, "Agent workflow", t0, t0 + 21 * MS, **{kind: "CHAIN"}),
        _span(tid, root, 0, "Agent workflow", t0, t0 + 21 * MS, **{kind: "AGENT"}),
    ]  # fmt: skip
    return _request(src), _request(dst)


def _request(spans: list[Span]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value="agents-app"))
    )
    ss = rs.scope_spans.add()
    ss.scope.name = SCOPE
    ss.spans.extend(spans)
    return req.SerializeToString()


def post(serve: ServeHandle, body: bytes) -> None:
    req = urllib.request.Request(
        f"{serve.otlp_url}/v1/traces",
        data=body,
        headers={"Content-Type": "application/x-protobuf"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def derived_commits(serve: ServeHandle) -> set[str]:
    with serve.client() as c:
        rows = c.query(
            f"SELECT DISTINCT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'commit' AND attributes['handoff.derived_by'] = {r:String}",
            parameters={"r": RULE},
        ).result_rows
    return {r[0] for r in rows}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def measure_delay(n: int, rate: float, rng: random.Random) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        serve = start_serve(tmp, grpc_port=0)
        try:
            sent: dict[str, float] = {}
            seen: dict[str, float] = {}
            stop = threading.Event()

            def poll() -> None:
                while not stop.is_set():
                    now = time.monotonic()
                    for hid in derived_commits(serve) - seen.keys():
                        seen[hid] = now
                    stop.wait(0.05)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            t0 = time.time_ns()
            for i in range(n):
                first, second = handoff_requests(rng, t0 + i * 100 * MS)
                post(serve, first)
                post(serve, second)
                tid = ExportTraceServiceRequest.FromString(second).resource_spans[0]
                span0 = tid.scope_spans[0].spans[0]
                handoff_span = ExportTraceServiceRequest.FromString(first)
                h = handoff_span.resource_spans[0].scope_spans[0].spans[3]
                sent[f"{span0.trace_id.hex()}/{h.span_id.hex()}"] = time.monotonic()
                time.sleep(1 / rate)
            wait_until(lambda: len(seen) >= n, 120, f"{n} derived commits", every=0.1)
            stop.set()
            poller.join()
            return [seen[h] - sent[h] for h in sent]
        finally:
            serve.stop()


def measure_cpu(n: int, derive: bool, rng: random.Random) -> tuple[float, int]:
    """(serve CPU seconds from start to all stored/derived, spans sent)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = () if derive else ("--no-derive",)
        serve = start_serve(tmp, grpc_port=0, extra_args=args)
        try:
            before = cpu_s(serve.process.pid)
            t0 = time.time_ns()
            pairs = [handoff_requests(rng, t0 + i * 30 * MS) for i in range(n)]
            spans = 0
            for i in range(0, n, 50):  # 50 handoffs, 500 spans per request
                batch = pairs[i : i + 50]
                req = ExportTraceServiceRequest()
                for first, second in batch:
                    for body in (first, second):
                        req.MergeFromString(body)
                spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
                post(serve, req.SerializeToString())
            serve.wait_stored()
            if derive:
                wait_until(lambda: len(derived_commits(serve)) >= n, 300, "every commit", every=0.5)
                serve.wait_stored()
            return cpu_s(serve.process.pid) - before, spans
        finally:
            serve.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--handoffs", type=int, default=100, help="handoffs for the delay (100)")
    ap.add_argument("--rate", type=float, default=20.0, help="handoffs per second (20)")
    ap.add_argument("--cpu-handoffs", type=int, default=2000, help="handoffs for the CPU (2000)")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    delays = measure_delay(a.handoffs, a.rate, rng)
    p50, p95 = statistics.median(delays), pct(delays, 0.95)
    print(f"delay arrival -> derived commit in handoff_transitions, {len(delays)} handoffs: "
          f"p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(delays):.2f} s")  # fmt: skip
    base, spans = measure_cpu(a.cpu_handoffs, False, rng)
    on, spans_on = measure_cpu(a.cpu_handoffs, True, rng)
    per_base, per_on = base / spans * 1e6, on / spans_on * 1e6  # ms per 1,000 spans
    print(f"serve CPU, {spans:,} spans: --no-derive {base:.2f} s ({per_base:.1f} ms/1k spans), "
          f"derive {on:.2f} s ({per_on:.1f} ms/1k spans)")  # fmt: skip
    print(f"RESULT delay_p50_s={p50:.2f} delay_p95_s={p95:.2f} "
          f"cpu_ms_per_1k_spans_derive={per_on:.1f} cpu_ms_per_1k_spans_base={per_base:.1f} "
          f"derive_cpu_ms_per_1k_spans={per_on - per_base:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
