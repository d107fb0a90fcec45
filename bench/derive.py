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

`--source adk`: the same in the shape Google ADK's own tracing exports (scope
`gcp.vertex.agent`: an `invoke_workflow` span, the source's `invoke_agent` with its
`generate_content` and `execute_tool transfer_to_agent` (message content capture off: the
target not named), the target's `invoke_agent` with its `generate_content`; status Unset; 6
spans per handoff), derived by the ADK rule.

Last line: `RESULT delay_p50_s=.. delay_p95_s=.. cpu_ms_per_1k_spans_derive=..
cpu_ms_per_1k_spans_base=.. derive_cpu_ms_per_1k_spans=..`

    .venv/bin/python bench/derive.py --handoffs 100 --rate 20 --cpu-handoffs 2000
    .venv/bin/python bench/derive.py --source adk
    .venv/bin/python bench/derive.py --source strands

`--source strands`: a Strands Swarm handoff (scope `strands.telemetry.tracer`: the source's
`invoke_agent` with its `chat` and `execute_tool handoff_to_agent` naming the target in
`gen_ai.tool.call.arguments`, the target's `invoke_agent` with its `chat`, the
`invoke_swarm` root; 6 spans per handoff), derived by the Strands rule.
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

#: source -> (instrumentation scope, rule that derives it)
SOURCES = {
    "openinference": ("openinference.instrumentation.openai_agents",
                      "openinference.openai_agents.handoff"),
    "adk": ("gcp.vertex.agent", "adk.transfer_to_agent.handoff"),
    "strands": ("strands.telemetry.tracer", "strands.handoff_to_agent.handoff"),
}  # fmt: skip
MS = 1_000_000


def _span(
    tid: bytes, sid: int, parent: int, name: str, start: int, end: int, ok: bool = True, **attrs
) -> Span:
    return Span(
        trace_id=tid,
        span_id=sid.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status=Status(code=Status.STATUS_CODE_OK if ok else Status.STATUS_CODE_UNSET),
        attributes=[
            KeyValue(key=k.replace("__", "."), value=AnyValue(string_value=v))
            for k, v in attrs.items()
        ],
    )


def handoff_requests(rng: random.Random, t0: int, source: str) -> tuple[bytes, bytes, str]:
    """(source side, target side + workflow, handoff id) of one handoff, OTLP/protobuf."""
    if source == "adk":
        return adk_requests(rng, t0)
    if source == "strands":
        return strands_requests(rng, t0)
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
    scope = SOURCES["openinference"][0]
    return _request(src, scope), _request(dst, scope), f"{tid.hex()}/{h:016x}"


def adk_requests(rng: random.Random, t0: int) -> tuple[bytes, bytes, str]:
    """One ADK transfer, as ADK's tracer records it (module doc)."""
    tid = rng.randbytes(16)
    ids = iter(range(rng.getrandbits(40) << 8, (1 << 63)))
    wf, a, gen, tool, b, gen2 = (next(ids) for _ in range(6))
    op = "gen_ai__operation__name"
    src = [
        _span(tid, a, wf, "invoke_agent triage", t0 + 1 * MS, t0 + 10 * MS, False,
              **{op: "invoke_agent"}, gen_ai__agent__name="triage"),
        _span(tid, gen, a, "generate_content triage", t0 + 2 * MS, t0 + 8 * MS, False,
              **{op: "generate_content"}, gen_ai__agent__name="triage"),
        _span(tid, tool, a, "execute_tool transfer_to_agent", t0 + 8 * MS, t0 + 9 * MS, False,
              **{op: "execute_tool"}, gen_ai__tool__name="transfer_to_agent",
              gen_ai__agent__name="triage"),
    ]  # fmt: skip
    dst = [
        _span(tid, b, wf, "invoke_agent coder", t0 + 11 * MS, t0 + 20 * MS, False,
              **{op: "invoke_agent"}, gen_ai__agent__name="coder"),
        _span(tid, gen2, b, "generate_content coder", t0 + 12 * MS, t0 + 18 * MS, False,
              **{op: "generate_content"}, gen_ai__agent__name="coder"),
        _span(tid, wf, 0, "invoke_workflow triage", t0, t0 + 21 * MS, False,
              **{op: "invoke_workflow"}, gen_ai__workflow__name="triage"),
    ]  # fmt: skip
    scope = SOURCES["adk"][0]
    return _request(src, scope), _request(dst, scope), f"{tid.hex()}/{tool:016x}"


def strands_requests(rng: random.Random, t0: int) -> tuple[bytes, bytes, str]:
    """One Strands Swarm handoff, as Strands' tracer records it (module doc)."""
    tid = rng.randbytes(16)
    ids = iter(range(rng.getrandbits(40) << 8, (1 << 63)))
    swarm, a, chat, tool, b, chat2 = (next(ids) for _ in range(6))
    op = "gen_ai__operation__name"
    src = [
        _span(tid, a, swarm, "invoke_agent triage", t0 + 1 * MS, t0 + 10 * MS, False,
              **{op: "invoke_agent"}, gen_ai__agent__name="triage"),
        _span(tid, chat, a, "chat", t0 + 2 * MS, t0 + 8 * MS, False, **{op: "chat"}),
        _span(tid, tool, a, "execute_tool handoff_to_agent", t0 + 8 * MS, t0 + 9 * MS, False,
              **{op: "execute_tool"}, gen_ai__tool__name="handoff_to_agent",
              gen_ai__tool__call__arguments='{"agent_name": "coder", "message": "fix it"}'),
    ]  # fmt: skip
    dst = [
        _span(tid, b, swarm, "invoke_agent coder", t0 + 11 * MS, t0 + 20 * MS, False,
              **{op: "invoke_agent"}, gen_ai__agent__name="coder"),
        _span(tid, chat2, b, "chat", t0 + 12 * MS, t0 + 18 * MS, False, **{op: "chat"}),
        _span(tid, swarm, 0, "invoke_swarm", t0, t0 + 21 * MS, False, **{op: "invoke_swarm"}),
    ]  # fmt: skip
    scope = SOURCES["strands"][0]
    return _request(src, scope), _request(dst, scope), f"{tid.hex()}/{tool:016x}"


def _request(spans: list[Span], scope: str) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value="agents-app"))
    )
    ss = rs.scope_spans.add()
    ss.scope.name = scope
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


def derived_commits(serve: ServeHandle, rule: str) -> set[str]:
    with serve.client() as c:
        rows = c.query(
            f"SELECT DISTINCT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'commit' AND attributes['handoff.derived_by'] = {r:String}",
            parameters={"r": rule},
        ).result_rows
    return {r[0] for r in rows}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def measure_delay(n: int, rate: float, rng: random.Random, source: str) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        serve = start_serve(tmp, grpc_port=0)
        try:
            sent: dict[str, float] = {}
            seen: dict[str, float] = {}
            stop = threading.Event()

            def poll() -> None:
                while not stop.is_set():
                    now = time.monotonic()
                    for hid in derived_commits(serve, SOURCES[source][1]) - seen.keys():
                        seen[hid] = now
                    stop.wait(0.05)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            t0 = time.time_ns()
            for i in range(n):
                first, second, hid = handoff_requests(rng, t0 + i * 100 * MS, source)
                post(serve, first)
                post(serve, second)
                sent[hid] = time.monotonic()
                time.sleep(1 / rate)
            wait_until(lambda: len(seen) >= n, 120, f"{n} derived commits", every=0.1)
            stop.set()
            poller.join()
            return [seen[h] - sent[h] for h in sent]
        finally:
            serve.stop()


def measure_cpu(n: int, derive: bool, rng: random.Random, source: str) -> tuple[float, int]:
    """(serve CPU seconds from start to all stored/derived, spans sent)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = () if derive else ("--no-derive",)
        serve = start_serve(tmp, grpc_port=0, extra_args=args)
        try:
            before = cpu_s(serve.process.pid)
            t0 = time.time_ns()
            pairs = [handoff_requests(rng, t0 + i * 30 * MS, source)[:2] for i in range(n)]
            spans = 0
            for i in range(0, n, 50):  # 50 handoffs per request
                batch = pairs[i : i + 50]
                req = ExportTraceServiceRequest()
                for first, second in batch:
                    for body in (first, second):
                        req.MergeFromString(body)
                spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
                post(serve, req.SerializeToString())
            serve.wait_stored()
            if derive:
                rule = SOURCES[source][1]
                wait_until(lambda: len(derived_commits(serve, rule)) >= n, 300, "every commit",
                           every=0.5)  # fmt: skip
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
    ap.add_argument("--source", choices=sorted(SOURCES), default="openinference",
                    help="span shape: openinference (OpenAI Agents SDK) or adk (Google ADK)")  # fmt: skip
    a = ap.parse_args()
    rng = random.Random(a.seed)
    if min(a.handoffs, a.cpu_handoffs) < 1 or a.rate <= 0:
        ap.error("--handoffs and --cpu-handoffs must be >= 1, --rate > 0")
    delays = measure_delay(a.handoffs, a.rate, rng, a.source)
    p50, p95 = statistics.median(delays), pct(delays, 0.95)
    print(f"delay arrival -> derived commit in handoff_transitions, {len(delays)} handoffs: "
          f"p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(delays):.2f} s")  # fmt: skip
    base, spans = measure_cpu(a.cpu_handoffs, False, rng, a.source)
    on, spans_on = measure_cpu(a.cpu_handoffs, True, rng, a.source)
    per_base, per_on = base / spans * 1e6, on / spans_on * 1e6  # ms per 1,000 spans
    print(f"serve CPU, {spans:,} spans: --no-derive {base:.2f} s ({per_base:.1f} ms/1k spans), "
          f"derive {on:.2f} s ({per_on:.1f} ms/1k spans)")  # fmt: skip
    print(f"RESULT source={a.source} delay_p50_s={p50:.2f} delay_p95_s={p95:.2f} "
          f"cpu_ms_per_1k_spans_derive={per_on:.1f} cpu_ms_per_1k_spans_base={per_base:.1f} "
          f"derive_cpu_ms_per_1k_spans={per_on - per_base:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
