"""Handoffs in Strands Agents' built-in OpenTelemetry tracing (scope
`strands.telemetry.tracer`): a Swarm node's `handoff_to_agent` call, recorded as an
`execute_tool handoff_to_agent` span inside the source node's `invoke_agent <name>` span, and
the target's run as the `invoke_agent` span the swarm starts next under the same
`invoke_swarm` span (the node runs are siblings, in order).

The traps, as Strands records them:
- the source is the enclosing `invoke_agent` span's agent; the target is on no attribute by
  default. It is read from the tool's input: `gen_ai.tool.call.arguments` (with
  `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`), else the `content` of the tool
  span's `gen_ai.tool.message` event (`{"agent_name": ...}`, Strands' default). With neither
  (content redacted or not stored) the target is the first `invoke_agent` span of the same
  swarm that starts at or after the tool span ends (the swarm runs the handed-to node next);
  until that span is stored nothing is derived, and a swarm that ended without one gives
  `handoff_target_unresolved`;
- the swarm's span stays Unset when a node failed (the swarm catches the node's error and
  stops): a failed node is read from the node's own `invoke_agent` span (Error) or a model
  call under it (Error), never from the root. The error code is the recorded exception's
  class in snake case (`internal_server_error`);
- a `handoff_to_agent` call that ended with Error (an unknown agent) is no handoff.
Mapping table: docs/derived-handoffs.md.
"""

from __future__ import annotations

import json
import re
from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import GENAI_OP, Runs, Subtrees, TraceIndex, run_kinds

__all__ = ["STRANDS", "STRANDS_SCOPE", "handoff_target", "strands_rule"]

STRANDS: Final = "strands.handoff_to_agent.handoff"
#: the instrumentation scope of Strands' tracer
STRANDS_SCOPE: Final = "strands.telemetry.tracer"
_HANDOFF: Final = "handoff_to_agent"
_AGENT: Final = "gen_ai.agent.name"
_TOOL: Final = "gen_ai.tool.name"
_ARGS: Final = "gen_ai.tool.call.arguments"
_TOOL_MESSAGE: Final = "gen_ai.tool.message"
_EVIDENCE_OPS: Final = frozenset({"chat", "execute_tool"})
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _is_strands(s: SpanRecord) -> bool:
    return s.scope == STRANDS_SCOPE


def _is_invoke(s: SpanRecord) -> bool:
    return _is_strands(s) and s.attr(GENAI_OP) == "invoke_agent"


def _is_swarm(s: SpanRecord) -> bool:
    return _is_strands(s) and s.attr(GENAI_OP) == "invoke_swarm"


def _is_handoff(s: SpanRecord) -> bool:
    return _is_strands(s) and s.attr(GENAI_OP) == "execute_tool" and s.attr(_TOOL) == _HANDOFF


def _agent_name(raw: str) -> str | None:
    try:
        args = json.loads(raw)
    except ValueError:
        return None
    name = args.get("agent_name") if isinstance(args, dict) else None
    return name if isinstance(name, str) and name else None


def handoff_target(span: SpanRecord) -> str | None:
    """The agent a `handoff_to_agent` span names in its input: `gen_ai.tool.call.arguments`,
    else its `gen_ai.tool.message` event's `content`; None when neither names one."""
    if span.attr(_ARGS):
        named = _agent_name(span.attr(_ARGS))
        if named is not None:
            return named
    for e in span.events:
        if e.name == _TOOL_MESSAGE and e.attributes.get("content"):
            named = _agent_name(e.attributes["content"])
            if named is not None:
                return named
    return None


def _error(span: SpanRecord) -> str | None:
    """Why `span` failed (Error only): its recorded exception's class in snake case
    (`openai.InternalServerError` -> `internal_server_error`; Strands' status description is
    the exception's text, which varies), else `error.type`, else the status description."""
    if span.status != "Error":
        return None
    exc = next((e.attributes.get("exception.type", "") for e in span.events
                if e.name == "exception"), "")  # fmt: skip
    if exc:
        return slug(_CAMEL.sub("_", exc.rpartition(".")[2]))
    return slug(span.attr("error.type") or span.status_message or None)


_KINDS: Final = run_kinds(
    error_of=_error, evidence_ops=_EVIDENCE_OPS, is_transfer=_is_handoff, prefix="strands"
)


def _run_keys(trace: TraceIndex, s: SpanRecord) -> list[tuple[str | None, str | None]]:
    """The groups a node run is a candidate target in: (swarm span id, or None for the whole
    trace; its agent, or None for any agent)."""
    swarm = trace.nearest(s, _is_swarm)
    scope = swarm.span_id if swarm is not None else None
    return [(scope, s.attr(_AGENT)), (scope, None)]


def _task_id(tool: SpanRecord, swarm: SpanRecord | None, node: SpanRecord | None) -> str:
    """The swarm's id as the task: its span's id, known from the node run's parent before the
    swarm's own span (which ends, and so is exported, last) is stored; the same on every pass,
    so a task's handoffs stay one task."""
    swarm_id = swarm.span_id if swarm is not None else (node.parent_span_id if node else "")
    return f"{tool.trace_id}/{swarm_id}" if swarm_id else tool.trace_id


def strands_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of Strands `handoff_to_agent` tool spans in `trace` (module doc)."""
    # one per span id: a resent span may be stored twice
    tools = list(
        {s.span_id: s for s in trace.spans if _is_handoff(s) and s.status != "Error"}.values()
    )
    if not tools:
        return []
    root = next((s for s in trace.spans if not s.parent_span_id), None)
    runs = Runs((s for s in trace.spans if _is_invoke(s)), lambda s: _run_keys(trace, s))
    runs_of = Subtrees(trace, _KINDS)  # what each target run's descendants show
    made_by: dict[str, str] = {}  # target invoke_agent span id -> the handoff that started it
    out = []
    for t in tools:  # in start order: an earlier handoff claims its run first
        enclosing = trace.nearest(t, _is_invoke)
        from_agent = t.attr(_AGENT) or (enclosing.attr(_AGENT) if enclosing else "")
        if not from_agent:
            continue
        swarm = trace.nearest(t, _is_swarm)
        scope = swarm.span_id if swarm is not None else None
        up = trace.ancestor_ids(t)
        named = handoff_target(t)
        # the swarm runs the handed-to node after the source node's run ends
        after = enclosing.end_ns if enclosing is not None else t.end_ns
        nxt = runs.first((scope, named), after, skip=up) if named else None
        if named is None:
            nxt = runs.first((scope, None), after, skip=up)
        to_agent = named or (nxt.attr(_AGENT) if nxt is not None else None)
        handoff_id = f"{t.trace_id}/{t.span_id}"
        ended = swarm or root
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
        out.append(
            Observed(
                rule=STRANDS,
                task_id=_task_id(t, swarm, enclosing),
                handoff_id=handoff_id,
                causation_id=made_by.get(enclosing.span_id) if enclosing is not None else None,
                source=t,
                from_agent=from_agent,
                to_agent=to_agent,
                topology="in_process",
                target=runs_of.target(nxt, _error(nxt)) if nxt is not None else None,
                run_ended_ns=ended.end_ns if ended is not None else None,
            )
        )
    return out
