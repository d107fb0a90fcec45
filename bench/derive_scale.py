"""Derivation cost against a trace's size: one trace of n spans and one of 4n, per source
shape, timed in one run; the ratio of the two times is ~4 when the cost is linear (~16 when
it grows with the square).

Shapes (one trace each, a handoff every 3 spans, the target the next agent's run):
`genai`, `adk`, `openinference`, `openllmetry`, `langgraph` (the agent runs siblings under
one root, as the frameworks record them), and `genai-nested` (each target run inside the
one before: every run's descendants are all the later ones). Times are the best of
`--repeat` runs (default 5) of `derive.new_transitions` (all rules over one tenant's trace, the pure part of a pass).

Last line: `RESULT <shape>_ratio=.. ...` (time at 4n / time at n).

    .venv/bin/python bench/derive_scale.py --spans 1000
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=1000, help="spans of the smaller trace")
    ap.add_argument("--repeat", type=int, default=5, help="runs per size (the best counts)")
    args = ap.parse_args()
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
