"""Handoffs in Google ADK's built-in OpenTelemetry tracing (scope `gcp.vertex.agent`): an
agent's `transfer_to_agent` call, recorded as an `execute_tool transfer_to_agent` span under
the source agent's `invoke_agent` span, and the target's run as the `invoke_agent` span the
runner starts next under the same `invoke_workflow` span.

The traps, as ADK records them:
- the source is named (`gen_ai.agent.name` on the tool span), the target only with message
  content capture on (`gen_ai.tool.call.arguments` = `{"agent_name": ...}`, or
  `gcp.vertex.agent.tool_call_args` in ADK's legacy span schema). Without it the target is
  the first `invoke_agent` span of the same workflow that starts at or after the tool span
  ends (ADK runs the transferred-to agent next); until that span is stored nothing is
  derived, and a workflow that ended without one gives `handoff_target_unresolved`;
- ADK leaves a successful span's status Unset, never Ok: Unset counts as success, Error as
  failure.
Mapping table: docs/derived-handoffs.md.
"""

from __future__ import annotations

import json
from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import Runs, Subtrees, TraceIndex, run_kinds

__all__ = ["ADK", "ADK_SCOPE", "adk_rule", "transfer_target"]

ADK: Final = "adk.transfer_to_agent.handoff"
#: the instrumentation scope of ADK's tracer
ADK_SCOPE: Final = "gcp.vertex.agent"
_TRANSFER: Final = "transfer_to_agent"
_OP: Final = "gen_ai.operation.name"
_AGENT: Final = "gen_ai.agent.name"
_TOOL: Final = "gen_ai.tool.name"
_ARG_KEYS: Final = ("gen_ai.tool.call.arguments", "gcp.vertex.agent.tool_call_args")
_EVIDENCE_OPS: Final = frozenset({"generate_content", "chat", "execute_tool"})


def _is_adk(s: SpanRecord) -> bool:
    return s.scope == ADK_SCOPE


def _is_invoke(s: SpanRecord) -> bool:
    return _is_adk(s) and s.attr(_OP) == "invoke_agent"


def _is_workflow(s: SpanRecord) -> bool:
    return _is_adk(s) and s.attr(_OP) == "invoke_workflow"


def _is_transfer(s: SpanRecord) -> bool:
    return _is_adk(s) and s.attr(_OP) == "execute_tool" and s.attr(_TOOL) == _TRANSFER


def transfer_target(span: SpanRecord) -> str | None:
    """The agent a `transfer_to_agent` span names in its captured arguments; None when
    content capture is off (`{}` or absent) or the arguments do not parse."""
    for key in _ARG_KEYS:
        raw = span.attr(key)
        if not raw:
            continue
        try:
            args = json.loads(raw)
        except ValueError:
            continue
        name = args.get("agent_name") if isinstance(args, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def _error(span: SpanRecord) -> str | None:
    """Why `span` failed (Error status only; Unset and Ok are success)."""
    if span.status != "Error":
        return None
    exc = next((e.attributes.get("exception.type", "") for e in span.events
                if e.name == "exception"), "")  # fmt: skip
    return slug(span.status_message or span.attr("error.type") or exc or None)


_KINDS: Final = run_kinds(
    error_of=_error, evidence_ops=_EVIDENCE_OPS, is_transfer=_is_transfer, prefix="adk"
)


def _run_keys(trace: TraceIndex, s: SpanRecord) -> list[tuple[str | None, str | None]]:
    """The groups an `invoke_agent` span is a candidate target run in: (workflow span id or
    None for the whole trace, its agent or None for any agent), for each `invoke_workflow`
    above it."""
    scopes: list[str | None] = [None]
    scopes += [a.span_id for a in trace.ancestors(s) if _is_workflow(a)]
    return [(w, agent) for w in scopes for agent in (s.attr(_AGENT), None)]


def _task_id(tool: SpanRecord, workflow: SpanRecord | None, run: SpanRecord | None) -> str:
    """The workflow's id as the task: its span's id, known from the agent run's parent (ADK
    nests each `invoke_agent` directly under `invoke_workflow`) before the workflow's own
    span (which ends, and so is exported, last) is stored; the same on every pass, so a
    task's transfers stay one task."""
    wf_id = workflow.span_id if workflow is not None else (run.parent_span_id if run else "")
    return f"{tool.trace_id}/{wf_id}" if wf_id else tool.trace_id


def adk_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of ADK `transfer_to_agent` tool spans in `trace` (module doc)."""
    # one per span id: a resent span may be stored twice
    tools = list(
        {s.span_id: s for s in trace.spans if _is_transfer(s) and s.status != "Error"}.values()
    )
    if not tools:
        return []
    root = next((s for s in trace.spans if not s.parent_span_id), None)
    runs = Runs((s for s in trace.spans if _is_invoke(s)), lambda s: _run_keys(trace, s))
    runs_of = Subtrees(trace, _KINDS)  # what each target run's descendants show
    made_by: dict[str, str] = {}  # target invoke_agent span id -> the handoff that started it
    out = []
    for t in tools:  # in start order: an earlier transfer claims its run first
        enclosing = trace.nearest(t, _is_invoke)
        from_agent = t.attr(_AGENT) or (enclosing.attr(_AGENT) if enclosing else "")
        if not from_agent:
            continue
        workflow = trace.nearest(t, _is_workflow)
        up = trace.ancestor_ids(t)
        scope = workflow.span_id if workflow is not None else None
        named = transfer_target(t)
        if named is not None:
            nxt = runs.first((scope, named), t.start_ns, skip=up)
        else:
            nxt = runs.first((scope, None), t.end_ns, skip=up)
        to_agent = named or (nxt.attr(_AGENT) if nxt is not None else None)
        handoff_id = f"{t.trace_id}/{t.span_id}"
        ended = workflow or root
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
        out.append(
            Observed(
                rule=ADK,
                task_id=_task_id(t, workflow, enclosing),
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
