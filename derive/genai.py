"""Handoffs in the OTel GenAI semantic conventions: a transfer recorded as an
`execute_tool` span with `gen_ai.agent.handoff.source.name` / `.target.name` (proposed
attributes), the target's run as the `invoke_agent` span that follows it.

The agent-to-agent model under review (unstable, like the attributes above) refines the
`execute_tool` span as a transfer: `gen_ai.transfer.mode` (`return_to_caller`: delegate,
`pass_control`: transfer), `gen_ai.transfer.target.name` and `gen_ai.transfer.target.type`
(`agent`; `workflow`: the target's run is an `invoke_workflow` span named by
`gen_ai.workflow.name`; `human`: an escalation, whose handling no span shows). The target's
`invoke_agent` may name its caller (`gen_ai.caller.name`): a run naming another caller is
never taken as this transfer's. A transfer is read from these attributes only, never from a
tool's name.

The target's run: the first `invoke_agent` span of the target agent in the same trace that
starts at or after the tool span and is not one of its ancestors. A run nested inside the
tool span (an agent used as a tool) returns to the caller: a delegation (`delegate` unless
`gen_ai.transfer.mode` says otherwise, topology `agent_as_tool`), accepted and started at
that run's start. The run ended (what is
missing will not come) once the trace's root span (no parent) is stored. Mapping table:
docs/derived-handoffs.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import Runs, Subtrees, TraceIndex, run_kinds

__all__ = [
    "CALLER_NAME",
    "GENAI",
    "SOURCE_NAME",
    "TARGET_NAME",
    "TRANSFER_MODE",
    "TRANSFER_TARGET_NAME",
    "TRANSFER_TARGET_TYPE",
    "genai_rule",
]

GENAI: Final = "genai.execute_tool.handoff"
SOURCE_NAME: Final = "gen_ai.agent.handoff.source.name"
TARGET_NAME: Final = "gen_ai.agent.handoff.target.name"
#: the agent-to-agent transfer attributes (proposed, unstable; module doc)
TRANSFER_MODE: Final = "gen_ai.transfer.mode"
TRANSFER_TARGET_NAME: Final = "gen_ai.transfer.target.name"
TRANSFER_TARGET_TYPE: Final = "gen_ai.transfer.target.type"
CALLER_NAME: Final = "gen_ai.caller.name"
#: gen_ai.transfer.mode -> the envelope's mode (absent or another value: transfer)
_MODES: Final = {"return_to_caller": "delegate", "pass_control": "transfer"}
_WORKFLOW: Final = "gen_ai.workflow.name"
_OP: Final = "gen_ai.operation.name"
_AGENT: Final = "gen_ai.agent.name"
_MODEL_OPS: Final = frozenset({"chat", "text_completion", "generate_content", "execute_tool"})


def _is_invoke(s: SpanRecord) -> bool:
    return s.attr(_OP) == "invoke_agent"


def _is_transfer(s: SpanRecord) -> bool:
    return s.attr(_OP) == "execute_tool" and any(
        s.attr(k) for k in (TARGET_NAME, SOURCE_NAME, TRANSFER_TARGET_NAME, TRANSFER_MODE)
    )


def _run_keys(s: SpanRecord) -> list[tuple[str, str, str | None]]:
    """The groups a run joins: (kind, name, its caller or "" when it names none), and
    (kind, name, None) for any caller."""
    if _is_invoke(s):
        kind, name = "agent", s.attr(_AGENT)
    elif s.attr(_OP) == "invoke_workflow":
        kind, name = "workflow", s.attr(_WORKFLOW)
    else:
        return []
    return [(kind, name, s.attr(CALLER_NAME)), (kind, name, None)]


def _error(span: SpanRecord) -> str | None:
    return slug(span.status_message or span.attr("error.type")) if span.status == "Error" else None


_KINDS: Final = run_kinds(
    error_of=_error, evidence_ops=_MODEL_OPS, is_transfer=_is_transfer, prefix="genai"
)


def genai_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of GenAI-convention transfer tool spans in `trace` (module doc)."""
    tools = [s for s in trace.spans if _is_transfer(s)]
    if not tools:
        return []
    runs = Runs(trace.spans, _run_keys)
    root = next((s for s in trace.spans if not s.parent_span_id), None)
    runs_of = Subtrees(trace, _KINDS)  # what each target run's descendants show
    made_by: dict[str, str] = {}  # target invoke_agent span id -> the handoff that started it
    out = []
    for t in tools:
        enclosing = trace.nearest(t, _is_invoke)
        from_agent = t.attr(SOURCE_NAME) or t.attr(_AGENT)
        if not from_agent and enclosing is not None:
            from_agent = enclosing.attr(_AGENT)
        if not from_agent:
            continue
        to_agent = t.attr(TARGET_NAME) or t.attr(TRANSFER_TARGET_NAME) or None
        kind = t.attr(TRANSFER_TARGET_TYPE) or "agent"
        mode = "escalate" if kind == "human" else _MODES.get(t.attr(TRANSFER_MODE), "transfer")
        nxt = None
        if to_agent is not None and kind != "human":
            up = trace.ancestor_ids(t)
            # a run naming this source as its caller, else one naming no caller
            nxt = runs.first((kind, to_agent, from_agent), t.start_ns, skip=up) or runs.first(
                (kind, to_agent, ""), t.start_ns, skip=up
            )
        handoff_id = f"{t.trace_id}/{t.span_id}"
        src, topology = t, "in_process"
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
            if trace.is_ancestor(t.span_id, nxt):
                # the target ran inside the tool call (an agent used as a tool): control
                # returns to the caller, and the handoff is accepted when that run starts,
                # not at the tool span's end (after the run's results: clock_skew)
                src, topology = replace(t, end_ns=max(t.start_ns, nxt.start_ns)), "agent_as_tool"
                mode = _MODES.get(t.attr(TRANSFER_MODE), "delegate")
        out.append(
            Observed(
                rule=GENAI,
                task_id=t.trace_id,
                handoff_id=handoff_id,
                causation_id=made_by.get(enclosing.span_id) if enclosing is not None else None,
                source=src,
                from_agent=from_agent,
                to_agent=to_agent,
                topology=topology,
                target=runs_of.target(nxt, _error(nxt)) if nxt is not None else None,
                run_ended_ns=root.end_ns if root is not None else None,
                mode=mode,
                ends=("escalate", "") if mode == "escalate" and to_agent is not None else None,
            )
        )
    return out
