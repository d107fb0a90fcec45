"""Derivation cost against a trace's size: one trace of n spans and one of 4n, per source
shape, timed in one run; the ratio of the two times is ~4 when the cost is linear (~16 when
it grows with the square).

Shapes (one trace each, a handoff every 3 spans, the target the next agent's run):
`genai`, `adk`, `openinference`, `openllmetry`, `langgraph` (the agent runs siblings under
one root, as the frameworks record them), and `genai-nested` (each target run inside the
one before: every run's descendants are all the later ones). Times are the best of
`--repeat` runs (default 5) of `derive.new_transitions` (all rules over one tenant's trace, the pure part of a pass).

Last line: `RESULT <shape>_ratio=.. ...` (time at 4n / time at n).

`--pass`: instead, a whole derivation pass (derive.DerivePass.run_once: the touched-traces
query, reading the trace's spans back, the rules, blind-spot bookkeeping and the submits,
counted, not ingested) over the trace stored in a scratch embedded store (this process's
chDB, a temp dir; each trace in a database of its own), timed in wall seconds, best of
--repeat: what one pass costs serve for a trace of n and of 4n spans.

    .venv/bin/python bench/derive_scale.py --spans 1000
    .venv/bin/python bench/derive_scale.py --spans 1500 --pass
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from derive import SpanRecord, new_transitions

MS = 1_000_000
TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
ADK = "gcp.vertex.agent"
OI = "openinference.instrumentation.openai_agents"
TL = "opentelemetry.instrumentation.openai_agents"
LC = "openinference.instrumentation.langchain"


class _Trace:
    """Spans of one trace, numbered in the order made; times in ms."""

    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []

    def add(self, parent: int, name: str, start: int, end: int, scope: str = "app",
            status: str = "Unset", **attrs: str) -> int:  # fmt: skip
        sid = len(self.spans) + 1
        self.spans.append(
            SpanRecord(
                trace_id=TRACE,
                span_id=f"{sid:016x}",
                parent_span_id=f"{parent:016x}" if parent else "",
                name=name,
                start_ns=start * MS,
                end_ns=end * MS,
                status=status,
                scope=scope,
                service_name="bench",
                attributes={k.replace("__", "."): v for k, v in attrs.items()},
            )
        )
        return sid


def _agent(j: int) -> str:
    return f"agent{j % 7}"


def genai(handoffs: int, *, nested: bool = False) -> list[SpanRecord]:
    t = _Trace()
    parent = t.add(0, "conversation", 0, 20 * handoffs + 10)
    for j in range(handoffs):
        a, b = _agent(j), _agent(j + 1)
        s, e = (j + 1, 20 * handoffs - j) if nested else (10 * j + 1, 10 * j + 9)
        run = t.add(parent, f"invoke_agent {a}", s, e, gen_ai__operation__name="invoke_agent",
                    gen_ai__agent__name=a)  # fmt: skip
        t.add(run, "chat m", s, s + 1, gen_ai__operation__name="chat")
        t.add(run, f"execute_tool transfer_to_{b}", s, s + 1,
              gen_ai__operation__name="execute_tool",
              gen_ai__agent__handoff__source__name=a,
              gen_ai__agent__handoff__target__name=b)  # fmt: skip
        if nested:
            parent = run
    return t.spans


def adk(handoffs: int) -> list[SpanRecord]:
    t = _Trace()
    wf = t.add(0, "invoke_workflow x", 0, 10 * handoffs + 10, ADK,
               gen_ai__operation__name="invoke_workflow")  # fmt: skip
    for j in range(handoffs):
        a, s = _agent(j), 10 * j + 1
        run = t.add(wf, f"invoke_agent {a}", s, s + 8, ADK,
                    gen_ai__operation__name="invoke_agent", gen_ai__agent__name=a)  # fmt: skip
        t.add(run, f"generate_content {a}", s + 1, s + 4, ADK,
              gen_ai__operation__name="generate_content", gen_ai__agent__name=a)  # fmt: skip
        t.add(run, "execute_tool transfer_to_agent", s + 5, s + 6, ADK,
              gen_ai__operation__name="execute_tool", gen_ai__tool__name="transfer_to_agent",
              gen_ai__agent__name=a)  # fmt: skip
    return t.spans


def openinference(handoffs: int) -> list[SpanRecord]:
    t = _Trace()
    wf = t.add(0, "Agent workflow", 0, 10 * handoffs + 10, OI, openinference__span__kind="CHAIN")
    for j in range(handoffs):
        a, b, s = _agent(j), _agent(j + 1), 10 * j + 1
        run = t.add(wf, a, s, s + 8, OI, "Ok", openinference__span__kind="AGENT", agent__name=a)
        t.add(run, "generation", s + 1, s + 4, OI, "Ok", openinference__span__kind="LLM")
        t.add(run, f"handoff to {b}", s + 5, s + 6, OI, "Ok", openinference__span__kind="TOOL",
              input__value=a, output__value=b)  # fmt: skip
    return t.spans


def openllmetry(handoffs: int) -> list[SpanRecord]:
    t = _Trace()
    wf = t.add(0, "Agent Workflow", 0, 10 * handoffs + 10, TL, traceloop__span__kind="workflow")
    for j in range(handoffs):
        a, s = _agent(j), 10 * j + 1
        run = t.add(wf, f"{a}.agent", s, s + 8, TL, traceloop__span__kind="agent",
                    gen_ai__agent__name=a, gen_ai__operation__name="invoke_agent")  # fmt: skip
        t.add(run, "openai.response", s + 1, s + 4, TL, gen_ai__operation__name="chat")
        t.add(run, f"{a} → unknown.handoff", s + 5, s + 6, TL, traceloop__span__kind="handoff",
              gen_ai__operation__name="handoff", gen_ai__handoff__from_agent=a)  # fmt: skip
    return t.spans


def langgraph(handoffs: int) -> list[SpanRecord]:
    t = _Trace()
    root = t.add(0, "LangGraph", 0, 10 * handoffs + 10, LC, openinference__span__kind="CHAIN")
    for j in range(handoffs):
        a, b, s = _agent(j), _agent(j + 1), 10 * j + 1
        node = t.add(root, a, s, s + 8, LC, "Ok", openinference__span__kind="CHAIN")
        t.add(node, "ChatOpenAI", s + 1, s + 4, LC, "Ok", openinference__span__kind="LLM")
        t.add(node, f"transfer_to_{b}", s + 5, s + 6, LC, "Ok",
              openinference__span__kind="TOOL", tool__name=f"transfer_to_{b}",
              output__value=f'{{"graph": "__parent__", "update": {{}}, "goto": "{b}"}}')  # fmt: skip
    return t.spans


SHAPES: dict[str, Callable[[int], list[SpanRecord]]] = {
    "genai": genai,
    "genai-nested": lambda n: genai(n, nested=True),
    "adk": adk,
    "openinference": openinference,
    "openllmetry": openllmetry,
    "langgraph": langgraph,
}


def seconds(spans: list[SpanRecord], repeat: int) -> float:
    """The best of `repeat` runs of new_transitions over `spans`, in CPU seconds of the
    calling thread (time.thread_time: a busy machine's other processes do not count; the
    garbage collector held off while timing: its pauses land on whichever run they fall in)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.thread_time()
            new_transitions(spans)
            best = min(best, time.thread_time() - t0)
        finally:
            gc.enable()
    return best


def ratio(shape: str, spans: int, repeat: int = 5) -> tuple[float, float]:
    """(seconds at ~`spans` spans, seconds at ~4x as many) for one trace of `shape`."""
    make = SHAPES[shape]
    small, large = make(spans // 3), make(4 * spans // 3)
    return seconds(small, repeat), seconds(large, repeat)


def _store(client, db: str, spans: list[SpanRecord]) -> None:
    """`spans`, moved to now (a pass reads the last hour), into otel_traces as serve would."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from ingest import decode_protobuf, write_batch
    from ingest.testing import key_value

    shift = time.time_ns() - 60 * 10**9
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.scope.name = spans[0].scope
    for s in spans:
        sp = ss.spans.add(trace_id=bytes.fromhex(s.trace_id), span_id=bytes.fromhex(s.span_id),
                          name=s.name, start_time_unix_nano=s.start_ns + shift,
                          end_time_unix_nano=s.end_ns + shift)  # fmt: skip
        if s.parent_span_id:
            sp.parent_span_id = bytes.fromhex(s.parent_span_id)
        sp.status.code = {"Ok": 1, "Error": 2}.get(s.status, 0)
        sp.attributes.extend(key_value(k, v) for k, v in s.attributes.items())
    decoded = decode_protobuf(req.SerializeToString(), tenant="default")
    write_batch(client, db, [decoded], batch_id=db, prev_chain="0" * 64,
                received_at_ms=int(time.time() * 1000), source="bench")  # fmt: skip


def pass_seconds(client, path: str, spans: list[SpanRecord], repeat: int) -> tuple[float, int]:
    """(best wall seconds of one pass over the stored trace, transitions it derived)."""
    import uuid

    from derive import DerivePass
    from foundation.store import StoreSpec, apply_schema, connect

    db = f"ds_{uuid.uuid4().hex[:10]}"
    apply_schema(client, db)
    _store(client, db, spans)
    best, derived = float("inf"), 0
    for _ in range(repeat):  # submits are dropped: the pass's own work is timed
        p = DerivePass(lambda: connect(StoreSpec(kind="chdb", path=path, database=db)), db,
                       lambda _body, _tenant: None)  # fmt: skip
        try:
            r = p.run_once()
        finally:
            p.stop()
        best, derived = min(best, r.seconds), r.submitted
    client.command(f"DROP DATABASE {db} SYNC")
    return best, derived


def _passes(args: argparse.Namespace) -> int:
    import tempfile

    from foundation.store import StoreSpec, connect

    out = []
    with tempfile.TemporaryDirectory(prefix="bench-derive-scale-") as tmp:
        client = connect(StoreSpec(kind="chdb", path=tmp, database="default"), database="")
        for shape, make in SHAPES.items():
            (a, da), (b, db) = (pass_seconds(client, tmp, make(n // 3), args.repeat)
                                for n in (args.spans, 4 * args.spans))  # fmt: skip
            print(f"{shape:14} {args.spans:>7} spans {a:7.3f} s ({da} derived)   "
                  f"{4 * args.spans:>7} spans {b:7.3f} s ({db} derived)   x{b / a:.1f}")  # fmt: skip
            out.append(f"{shape.replace('-', '_')}_pass_ratio={b / a:.1f}")
        client.close()
    print("RESULT " + " ".join(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=1000, help="spans of the smaller trace")
    ap.add_argument("--repeat", type=int, default=5, help="runs per size (the best counts)")
    ap.add_argument("--pass", dest="whole_pass", action="store_true",
                    help="time whole derivation passes over a stored trace (module doc)")  # fmt: skip
    args = ap.parse_args()
    if args.whole_pass:
        return _passes(args)
    out = []
    for shape in SHAPES:
        small, large = ratio(shape, args.spans, args.repeat)
        print(f"{shape:14} {args.spans:>7} spans {small * 1000:8.1f} ms   "
              f"{4 * args.spans:>7} spans {large * 1000:8.1f} ms   x{large / small:.1f}")  # fmt: skip
        out.append(f"{shape.replace('-', '_')}_ratio={large / small:.1f}")
    print("RESULT " + " ".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
