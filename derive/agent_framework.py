"""Handoffs in Microsoft Agent Framework's built-in OpenTelemetry tracing (scope
`agent_framework`), as its `HandoffBuilder` workflows record them: no tool span (the
framework's middleware intercepts the `handoff_to_<agent>` call before a tool span starts),
but a workflow message.

- the handoff: a `message.send` span (kind PRODUCER) with `message.destination_executor_id`,
  under the source's `executor.process <source>` span (`executor.id` = source);
- its delivery: an `edge_group.process` span with `message.source_id`, `message.target_id` and
  `edge_group.delivered`, linked (a span link, not a parent) to the send;
- the target's run: the `executor.process <target>` span linked to the send whose
  `executor.id` is the destination, holding the target's `invoke_agent` span and its model
  calls. It is a child of `invoke_workflow`, not of the send: only the link joins them.

The traps: the same executor also receives broadcast messages (a `message.send` with no
destination, fanned out to every other agent), each as an `executor.process` span of its own
that runs no agent; only the span linked to the addressed send is the target's run. The
framework leaves a successful span's status Unset: Unset counts as success, Error as failure.
Executor ids are agent names in `HandoffBuilder` (an agent's name, else its id). The task is
the workflow run: `<trace id>/<the sending executor.process's parent span id>` (the
`invoke_workflow` span, which ends last: its id is known before it is stored). Links to
another trace are not followed (derivation reads one trace at a time). Mapping table:
docs/derived-handoffs.md.
"""

from __future__ import annotations

from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import Runs, Subtrees, TraceIndex, run_kinds

__all__ = ["AGENT_FRAMEWORK", "AGENT_FRAMEWORK_SCOPE", "agent_framework_rule"]

AGENT_FRAMEWORK: Final = "agent_framework.message.handoff"
#: the instrumentation scope of Agent Framework's tracer
AGENT_FRAMEWORK_SCOPE: Final = "agent_framework"
_OP: Final = "gen_ai.operation.name"
_TOOL: Final = "gen_ai.tool.name"
_SEND: Final = "message.send"
_DESTINATION: Final = "message.destination_executor_id"
_EXECUTOR: Final = "executor.process"
_EXECUTOR_ID: Final = "executor.id"
_EDGE: Final = "edge_group.process"
_DELIVERED: Final = "edge_group.delivered"
_DELIVERY: Final = "edge_group.delivery_status"
_EVIDENCE_OPS: Final = frozenset({"chat", "text_completion", "execute_tool"})


def _is_af(s: SpanRecord) -> bool:
    return s.scope == AGENT_FRAMEWORK_SCOPE


def _is_handoff(s: SpanRecord) -> bool:
    return _is_af(s) and s.name == _SEND and bool(s.attr(_DESTINATION))


def _is_executor(s: SpanRecord) -> bool:
    return _is_af(s) and (s.name == _EXECUTOR or s.name.startswith(f"{_EXECUTOR} "))


def _is_edge(s: SpanRecord) -> bool:
    return _is_af(s) and (s.name == _EDGE or s.name.startswith(f"{_EDGE} "))


def _is_workflow(s: SpanRecord) -> bool:
    return _is_af(s) and s.attr(_OP) == "invoke_workflow"


def _is_handoff_tool(s: SpanRecord) -> bool:
    # were a handoff tool's call recorded, it would be the handoff, not the target's work
    return s.attr(_OP) == "execute_tool" and s.attr(_TOOL).startswith("handoff_to_")


def _error(span: SpanRecord) -> str | None:
    """Why `span` failed (Error status only): its status description, else `error.type`,
    else its `exception` event's type."""
    if span.status != "Error":
        return None
    exc = next((e.attributes.get("exception.type", "") for e in span.events
                if e.name == "exception"), "")  # fmt: skip
    return slug(span.status_message or span.attr("error.type") or exc or None)


_KINDS: Final = run_kinds(
    error_of=_error, evidence_ops=_EVIDENCE_OPS, is_transfer=_is_handoff_tool,
    prefix="agent_framework",
)  # fmt: skip


def _undelivered(edges: list[SpanRecord]) -> str | None:
    """The error code of a send its edge groups did not deliver (all stored ones say
    `edge_group.delivered` false), None when one delivered it or none is stored."""
    if not edges or any(e.attr(_DELIVERED).lower() == "true" for e in edges):
        return None
    return slug(edges[0].attr(_DELIVERY) or "not_delivered")


def agent_framework_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of Agent Framework `message.send` spans addressed to an executor (module doc)."""
    sends = list({s.span_id: s for s in trace.spans if _is_handoff(s)}.values())
    if not sends:
        return []
    wanted = {s.span_id for s in sends}
    linked: dict[str, list[SpanRecord]] = {}  # send span id -> spans linking to it
    for s in trace.spans:
        for tid, sid in s.links:
            if sid in wanted and tid == s.trace_id:
                linked.setdefault(sid, []).append(s)

    def keys(s: SpanRecord) -> list[tuple[str, str]]:
        # a candidate target run per (send span id it links to, its executor id)
        return [(sid, s.attr(_EXECUTOR_ID)) for tid, sid in s.links
                if sid in wanted and tid == s.trace_id]  # fmt: skip

    runs = Runs((s for s in trace.spans if _is_executor(s)), keys)
    root = next((s for s in trace.spans if not s.parent_span_id), None)
    runs_of = Subtrees(trace, _KINDS)
    made_by: dict[str, str] = {}  # target executor.process span id -> its handoff's id
    out = []
    for m in sends:  # in start order: an earlier handoff's target claims its run first
        sender = trace.nearest(m, _is_executor)
        if sender is None or not sender.attr(_EXECUTOR_ID):
            continue  # the sender is not stored yet
        from_agent = sender.attr(_EXECUTOR_ID)
        to_agent = m.attr(_DESTINATION)
        edges = [e for e in linked.get(m.span_id, []) if _is_edge(e)]
        nxt = runs.first((m.span_id, to_agent), 0)
        handoff_id = f"{m.trace_id}/{m.span_id}"
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
        refused = _undelivered(edges) if nxt is None else None
        workflow = trace.nearest(m, _is_workflow)
        ended = workflow or root
        out.append(
            Observed(
                rule=AGENT_FRAMEWORK,
                # the sender's parent is the run's invoke_workflow span, known before that
                # span (it ends last) is stored: the task id never changes between passes
                task_id=f"{m.trace_id}/{sender.parent_span_id or sender.span_id}",
                handoff_id=handoff_id,
                causation_id=made_by.get(sender.span_id),
                source=m,
                from_agent=from_agent,
                to_agent=to_agent,
                topology="in_process",
                target=runs_of.target(nxt, _error(nxt)) if nxt is not None else None,
                run_ended_ns=ended.end_ns if ended is not None else None,
                ends=("reject", refused) if refused is not None else None,
            )
        )
    return out
