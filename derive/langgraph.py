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

from derive._model import Observed, SpanRecord, slug
from derive._trace import Kind, Runs, Subtrees, TraceIndex

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


def _under_target(s: SpanRecord) -> Kind | None:
    """A span under a target node: a failure unless a tool call; evidence when an LLM call
    or a tool call that is not a Command, and not in Error."""
    if _failed(s):
        return ("error", _error(s)) if _kind(s) != "TOOL" else None
    if s.status != "Error" and (_kind(s) == "LLM" or (_kind(s) == "TOOL" and not _goto(s))):
        return ("evidence", f"langgraph:{s.span_id}")
    return None


def langgraph_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of LangGraph Commands in `trace` (module doc)."""
    mine = [s for s in trace.spans if s.scope.startswith(_SCOPE)]
    gotos: dict[str, tuple[str, ...]] = {}  # span id -> _goto (each output parsed once)

    def goto(s: SpanRecord) -> tuple[str, ...]:
        if s.span_id not in gotos:
            gotos[s.span_id] = _goto(s)
        return gotos[s.span_id]

    commands = [s for s in mine if goto(s)]
    if not commands:
        return []
    # the innermost span carrying a Command: its ancestors may repeat it in their output
    inner = {a.span_id for c in commands for a in trace.ancestors(c) if goto(a) == goto(c)}
    # node runs by (the graph root they are a child of, node name)
    runs = Runs(mine, lambda s: ((s.parent_span_id, _node(s)),))
    runs_of = Subtrees(trace, _under_target)  # what each target node's descendants show
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
        for n, to_agent in enumerate(goto(c)):
            nxt = runs.first((root.span_id, to_agent), c.start_ns, skip=(node.span_id,))
            handoff_id = f"{c.trace_id}/{c.span_id}" + (f":{n}" if n else "")
            if nxt is not None:
                runs.claim(nxt)
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
                    target=(
                        runs_of.target(nxt, _error(nxt) if _failed(nxt) else None)
                        if nxt is not None
                        else None
                    ),
                    run_ended_ns=root.end_ns,
                )
            )
    return out
