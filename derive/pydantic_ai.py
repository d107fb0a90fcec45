"""Delegations in Pydantic AI's built-in OpenTelemetry instrumentation (scope `pydantic-ai`,
instrumentation versions 2 to 5): a tool whose function runs another agent, recorded as an
`execute_tool <tool>` span (`gen_ai.agent.name` = the calling agent) with the other agent's
`invoke_agent` span nested inside it.

The traps, as Pydantic AI records them:
- no span names a handoff: a tool is a delegation only when an agent run is nested in it
  (an `invoke_agent` span whose nearest tool-or-run ancestor is that tool span). A tool with
  no nested run is a plain tool and derives nothing; one that ran several agents gives one
  delegation, to the first (a handoff is read from its span once);
- control returns to the caller when the nested run ends, so each is a delegation (mode
  `delegate`, topology `agent_as_tool`), not a transfer: the caller's run goes on after it;
- the nested run starts after the tool span and ends before it, so the handoff is accepted
  and started when the nested run starts, and prepared and committed (or failed) when it
  ends: stamping `accept` at the tool span's end would put it after the run's results;
- a failed nested run ends with Error (`<exception type>: <message>` as its status), and so do
  the tool span and the caller's run when the error propagates. The error code is the
  exception type in snake case (`model_server_error`).
Mapping table: docs/derived-handoffs.md.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import GENAI_OP, Subtrees, TraceIndex, run_kinds

__all__ = ["PYDANTIC_AI", "PYDANTIC_AI_SCOPE", "nested_runs", "nested_source", "pydantic_ai_rule"]

PYDANTIC_AI: Final = "pydantic_ai.agent_delegation.handoff"
#: the instrumentation scope of Pydantic AI's tracer
PYDANTIC_AI_SCOPE: Final = "pydantic-ai"
_AGENT: Final = "gen_ai.agent.name"
_EVIDENCE_OPS: Final = frozenset({"chat", "execute_tool"})
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _is_pai(s: SpanRecord) -> bool:
    return s.scope == PYDANTIC_AI_SCOPE


def _is_invoke(s: SpanRecord) -> bool:
    return _is_pai(s) and s.attr(GENAI_OP) == "invoke_agent"


def _is_tool(s: SpanRecord) -> bool:
    return _is_pai(s) and s.attr(GENAI_OP) == "execute_tool"


def _error(span: SpanRecord) -> str | None:
    """Why `span` failed (Error only): the exception type of its status description
    (`ModelServerError: ...` -> `model_server_error`), else its `exception` event's type."""
    if span.status != "Error":
        return None
    head, sep, _ = (span.status_message or "").partition(": ")
    kind = head if sep and " " not in head else ""
    if not kind:
        exc = next((e.attributes.get("exception.type", "") for e in span.events
                    if e.name == "exception"), "")  # fmt: skip
        kind = exc.rpartition(".")[2]
    if not kind:
        return slug(span.status_message or None)
    return slug(_CAMEL.sub("_", kind))


def _is_delegation(s: SpanRecord) -> bool:
    return False  # a tool span is a delegation by its nested runs, never by itself


_KINDS: Final = run_kinds(
    error_of=_error, evidence_ops=_EVIDENCE_OPS, is_transfer=_is_delegation, prefix="pydantic_ai"
)


def nested_runs(trace: TraceIndex, tool: SpanRecord) -> list[SpanRecord]:
    """The agent runs nested in `tool`: its descendant `invoke_agent` spans with no other
    tool or run between (a run nested deeper belongs to a tool of that run), in start order."""
    out: list[SpanRecord] = []
    stack = list(trace.children(tool.span_id))
    seen = {tool.span_id}
    while stack:
        s = stack.pop()
        if s.span_id in seen:
            continue  # a cycle of parent links
        seen.add(s.span_id)
        if _is_invoke(s):
            out.append(s)
        elif not _is_tool(s):
            stack.extend(trace.children(s.span_id))
    return sorted({s.span_id: s for s in out}.values(), key=lambda s: (s.start_ns, s.span_id))


def nested_source(tool: SpanRecord, run: SpanRecord) -> SpanRecord:
    """`tool` as the span a delegation to the nested `run` is read from: it ends, as far as
    the handoff goes, when `run` starts (`accept` + `start` there, `create` at the tool's
    start), so no transition is stamped before the one it follows."""
    return replace(tool, end_ns=min(max(tool.start_ns, run.start_ns), tool.end_ns))


def pydantic_ai_rule(trace: TraceIndex) -> list[Observed]:
    """Delegations of Pydantic AI tool spans with agent runs nested in them (module doc)."""
    # one per span id: a resent span may be stored twice
    tools = list({s.span_id: s for s in trace.spans if _is_tool(s)}.values())
    if not tools:
        return []
    runs_of = Subtrees(trace, _KINDS)  # what each nested run's descendants show
    made_by: dict[str, str] = {}  # nested invoke_agent span id -> the delegation that ran it
    out = []
    for t in tools:  # in start order: an outer delegation comes before those inside it
        runs = nested_runs(trace, t)
        if not runs:
            continue
        enclosing = trace.nearest(t, _is_invoke)
        from_agent = t.attr(_AGENT) or (enclosing.attr(_AGENT) if enclosing else "")
        if not from_agent:
            continue
        run = runs[0]
        to_agent = run.attr(_AGENT)
        if not to_agent:
            continue
        handoff_id = f"{t.trace_id}/{t.span_id}"
        made_by[run.span_id] = handoff_id
        out.append(
            Observed(
                rule=PYDANTIC_AI,
                task_id=t.trace_id,
                handoff_id=handoff_id,
                causation_id=made_by.get(enclosing.span_id) if enclosing else None,
                source=nested_source(t, run),
                from_agent=from_agent,
                to_agent=to_agent,
                mode="delegate",
                topology="agent_as_tool",
                target=runs_of.target(run, _error(run)),
            )
        )
    return out
