"""LangGraph multi-agent handoffs (langgraph-swarm, langgraph-supervisor, `Command(goto=...)`)
as `openinference-instrumentation-langchain` exports them.

A handoff in LangGraph is a `Command` with a `goto`: the handoff tools of langgraph-swarm and
langgraph-supervisor (`transfer_to_<agent>`) return `Command(goto=<agent>,
graph=Command.PARENT)`, which LangGraph carries up by raising `ParentCommand`. So the spans
of the source agent's node show an `exception` event (`langgraph.errors.ParentCommand`) while
their status is OK: that is control flow, never a failure. The instrumentation records the
Command as the span's `output.value` (JSON with `goto`). The source is the graph node that
ran it (a child of the graph's root span), the target the node named `goto` that the graph
runs next. Mapping table: docs/derived-handoffs.md.
"""

from __future__ import annotations

import json
from typing import Any, Final

from derive._model import Observed, SpanRecord, Target, slug
from derive._trace import TraceIndex, next_after

__all__ = ["LANGGRAPH", "langgraph_rule"]

LANGGRAPH: Final = "openinference.langgraph.handoff"
_SCOPE: Final = "openinference.instrumentation.langchain"
#: exceptions LangGraph raises for control flow (a handoff, an interrupt), not failures
_CONTROL_FLOW: Final = ("ParentCommand", "GraphBubbleUp", "GraphInterrupt")


def _kind(s: SpanRecord) -> str:
    return s.attr("openinference.span.kind")


def _goto(s: SpanRecord) -> tuple[str, ...]:
    """The agents a Command in the span's output goes to; () when it is not a Command."""
    text = s.attr("output.value")
    if '"goto"' not in text:
        return ()
    try:
        value: Any = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(value, dict) or "goto" not in value or "update" not in value:
        return ()
    goto = value["goto"]
    items = goto if isinstance(goto, list) else [goto]
    out = []
    for g in items:
        if isinstance(g, str) and g and not g.startswith("__"):
            out.append(g)
        elif isinstance(g, dict) and isinstance(g.get("node"), str):  # a Send
            out.append(g["node"])
    return tuple(out)


def _node(s: SpanRecord) -> str:
    meta = s.attr("metadata")
    if '"langgraph_node"' in meta:
        try:
            node = json.loads(meta).get("langgraph_node")
        except (ValueError, AttributeError):
            node = None
        if isinstance(node, str):
            return node
    return s.name


def _failed(s: SpanRecord) -> bool:
    if s.status != "Error":
        return False
    types = [e.attributes.get("exception.type", "") for e in s.events if e.name == "exception"]
    return not (types and all(t.rsplit(".", 1)[-1] in _CONTROL_FLOW for t in types))


def _error(s: SpanRecord) -> str:
    """The exception's class name (snake case), else the status message's first line."""
    types = [e.attributes.get("exception.type", "") for e in s.events if e.name == "exception"]
    real = [t for t in types if t and t.rsplit(".", 1)[-1] not in _CONTROL_FLOW]
    if real:
        return slug(real[-1].rsplit(".", 1)[-1])
    return slug(s.status_message.split("\n", 1)[0].split("(", 1)[0])


def _target(trace: TraceIndex, span: SpanRecord) -> Target:
    error = _error(span) if _failed(span) else None
    evidence = []
    for s in sorted(trace.descendants(span), key=lambda x: (x.start_ns, x.span_id)):
        if _failed(s):
            if error is None and _kind(s) != "TOOL":
                error = _error(s)
        elif s.status != "Error" and (_kind(s) == "LLM" or (_kind(s) == "TOOL" and not _goto(s))):
            evidence.append(f"langgraph:{s.span_id}")
    return Target(span, error, tuple(evidence))


def langgraph_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of LangGraph Commands in `trace` (module doc)."""
    mine = [s for s in trace.spans if s.scope.startswith(_SCOPE)]
    commands = [s for s in mine if _goto(s)]
    if not commands:
        return []
    # the innermost span carrying a Command: its ancestors may repeat it in their output
    inner = {a.span_id for c in commands for a in trace.ancestors(c) if _goto(a) == _goto(c)}
    claimed: set[str] = set()
    made_by: dict[str, str] = {}  # target node span id -> the handoff that started it
    out = []
    for c in commands:
        if c.span_id in inner:
            continue
        # The graph node that ran it: the child of the graph's root span on its way up. The
        # root ends last; until it is stored the node cannot be told from the spans inside it.
        chain = [c, *trace.ancestors(c)]
        root = trace.outermost(c, lambda s: s.scope.startswith(_SCOPE))
        above = trace.parent(root)
        if root.parent_span_id and (above is None or above.scope.startswith(_SCOPE)):
            continue  # the root is not stored yet
        node = next((s for s in chain if s.parent_span_id == root.span_id), None)
        if node is None:
            continue
        from_agent = _node(node)
        nodes = [s for s in mine if s.parent_span_id == root.span_id]
        for n, to_agent in enumerate(_goto(c)):
            runs = [s for s in nodes if _node(s) == to_agent and s.span_id != node.span_id]
            nxt = next_after(runs, c.start_ns, claimed)
            handoff_id = f"{c.trace_id}/{c.span_id}" + (f":{n}" if n else "")
            if nxt is not None:
                claimed.add(nxt.span_id)
                made_by[nxt.span_id] = handoff_id
            out.append(
                Observed(
                    rule=LANGGRAPH,
                    task_id=f"{c.trace_id}/{root.span_id}",
                    handoff_id=handoff_id,
                    causation_id=made_by.get(node.span_id),
                    source=c,
                    from_agent=from_agent,
                    to_agent=to_agent,
                    target=_target(trace, nxt) if nxt is not None else None,
                    run_ended_ns=root.end_ns,
                )
            )
    return out
