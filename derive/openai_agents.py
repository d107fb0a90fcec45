"""OpenAI Agents SDK handoffs, as OpenInference and OpenLLMetry export them.

Both instrumentations turn the SDK's trace events into OTel spans: one workflow span per
Runner run, one span per agent run (siblings under the workflow, in the order the agents
ran), and one span per handoff under the turn that called the handoff tool. The handoff
span names its source; OpenInference also names its target, OpenLLMetry does not (it starts
its span before the SDK knows the target): there the target is the agent run that follows
the handoff in the same workflow, which is how the SDK's Runner proceeds. Mapping table:
docs/derived-handoffs.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import (
    Kind,
    Runs,
    Subtrees,
    TraceIndex,
    requested_agents,
    sdk_error_message,
)

__all__ = ["OPENINFERENCE", "OPENLLMETRY", "openinference_rule", "openllmetry_rule"]

OPENINFERENCE: Final = "openinference.openai_agents.handoff"
OPENLLMETRY: Final = "openllmetry.openai_agents.handoff"
MULTIPLE_HANDOFFS: Final = "Multiple handoffs requested"  # the SDK's wording


@dataclass(frozen=True, slots=True)
class _Dialect:
    rule: str
    scope: str
    is_workflow: Callable[[SpanRecord], bool]
    is_agent: Callable[[SpanRecord], bool]
    agent_name: Callable[[SpanRecord], str]
    is_handoff: Callable[[SpanRecord], bool]
    named_target: Callable[[SpanRecord], str]
    named_source: Callable[[SpanRecord], str]
    is_evidence: Callable[[SpanRecord], bool]
    is_tool: Callable[[SpanRecord], bool]  # tool errors go back to the model: not a failure


def _oi_kind(s: SpanRecord) -> str:
    return s.attr("openinference.span.kind")


def _oi_is_handoff(s: SpanRecord) -> bool:
    return (
        _oi_kind(s) == "TOOL"
        and not s.attr("tool.name")
        and (s.name == "handoff" or s.name.startswith("handoff to "))
    )


def _oi_target(s: SpanRecord) -> str:
    out = s.attr("output.value")
    if out and out != "__REDACTED__":
        return out
    return s.name.removeprefix("handoff to ") if s.name.startswith("handoff to ") else ""


def _oi_source(s: SpanRecord) -> str:
    v = s.attr("input.value")
    return "" if v == "__REDACTED__" else v


_OI = _Dialect(
    rule=OPENINFERENCE,
    scope="openinference.instrumentation.openai_agents",
    is_workflow=lambda s: not s.attr("agent.name") and _oi_kind(s) in ("AGENT", "CHAIN"),
    is_agent=lambda s: _oi_kind(s) == "AGENT" and bool(s.attr("agent.name")),
    agent_name=lambda s: s.attr("agent.name"),
    is_handoff=_oi_is_handoff,
    named_target=_oi_target,
    named_source=_oi_source,
    is_evidence=lambda s: (
        _oi_kind(s) == "LLM"
        or (_oi_kind(s) == "TOOL" and not _oi_is_handoff(s))
        or (_oi_kind(s) == "CHAIN" and s.name == "turn")
    ),
    is_tool=lambda s: _oi_kind(s) == "TOOL",
)


def _tl_kind(s: SpanRecord) -> str:
    return s.attr("traceloop.span.kind")


def _tl_target(s: SpanRecord) -> str:
    v = s.attr("gen_ai.handoff.to_agent")
    return "" if v == "unknown" else v


_TL = _Dialect(
    rule=OPENLLMETRY,
    scope="opentelemetry.instrumentation.openai_agents",
    is_workflow=lambda s: _tl_kind(s) == "workflow",
    is_agent=lambda s: _tl_kind(s) == "agent",
    agent_name=lambda s: s.attr("gen_ai.agent.name"),
    is_handoff=lambda s: _tl_kind(s) == "handoff" or s.attr("gen_ai.operation.name") == "handoff",
    named_target=_tl_target,
    named_source=lambda s: s.attr("gen_ai.handoff.from_agent"),
    is_evidence=lambda s: (
        _tl_kind(s) != "handoff"
        and (s.attr("gen_ai.operation.name") in ("chat", "execute_tool") or _tl_kind(s) == "tool")
    ),
    is_tool=lambda s: _tl_kind(s) == "tool" or s.attr("gen_ai.operation.name") == "execute_tool",
)


def _error(span: SpanRecord) -> str | None:
    return slug(sdk_error_message(span.status_message)) if span.status == "Error" else None


def _kinds(d: _Dialect) -> Callable[[SpanRecord], Kind | None]:
    """A span under a target run: a failure unless a tool or handoff call (tool errors go
    back to the model), else evidence when the dialect counts it."""
    prefix = d.rule.split(".")[0]

    def kind(s: SpanRecord) -> Kind | None:
        if s.status == "Error":
            fails = not d.is_tool(s) and not d.is_handoff(s)
            return ("error", slug(sdk_error_message(s.status_message))) if fails else None
        return ("evidence", f"{prefix}:{s.span_id}") if d.is_evidence(s) else None

    return kind


def _observe(trace: TraceIndex, d: _Dialect) -> list[Observed]:
    mine = [s for s in trace.spans if s.scope.startswith(d.scope)]
    if not mine:
        return []
    # agent runs by (workflow span, agent name) and by workflow span alone
    runs = Runs(
        (s for s in mine if d.is_agent(s)),
        lambda a: ((a.parent_span_id, d.agent_name(a)), (a.parent_span_id, None)),
    )
    runs_of = Subtrees(trace, _kinds(d))  # what each target run's descendants show
    made_by: dict[str, str] = {}  # target agent span id -> the handoff that started it
    last_to: dict[tuple[str, str], str] = {}  # (run, agent) -> the last handoff to it
    out = []
    for h in (s for s in mine if d.is_handoff(s)):
        # The source agent's span ends right after its handoff; until it is stored, the
        # run this handoff belongs to is not known: a later pass takes it.
        src_agent = trace.nearest(h, d.is_agent)
        if src_agent is None:
            continue
        from_agent = d.named_source(h) or d.agent_name(src_agent)
        run_id = src_agent.parent_span_id  # the workflow span: agent runs are its children
        workflow = trace.get(run_id)
        ended = workflow.end_ns if workflow is not None and d.is_workflow(workflow) else None
        to_agent = d.named_target(h) or None
        nxt = runs.first((run_id, to_agent), h.start_ns, skip=(src_agent.span_id,))
        if to_agent is None and nxt is not None:
            to_agent = d.agent_name(nxt) or None
        handoff_id = f"{h.trace_id}/{h.span_id}"
        # made inside an earlier handoff's target run: it hands that handoff's result on
        cause = made_by.get(src_agent.span_id) or last_to.get((run_id, from_agent))
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
        if to_agent is not None:
            last_to[(run_id, to_agent)] = handoff_id
        ignored: tuple[str, ...] = ()
        if h.status == "Error" and sdk_error_message(h.status_message) == MULTIPLE_HANDOFFS:
            ignored = requested_agents(h.status_message)[1:]
        out.append(
            Observed(
                rule=d.rule,
                task_id=f"{h.trace_id}/{run_id}",
                handoff_id=handoff_id,
                source=h,
                from_agent=from_agent,
                to_agent=to_agent,
                target=runs_of.target(nxt, _error(nxt)) if nxt is not None else None,
                run_ended_ns=ended,
                ignored=ignored,
                causation_id=cause,
            )
        )
    return out


def openinference_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of `openinference-instrumentation-openai-agents` spans in `trace`."""
    return _observe(trace, _OI)


def openllmetry_rule(trace: TraceIndex) -> list[Observed]:
    """Handoffs of OpenLLMetry's `opentelemetry-instrumentation-openai-agents` spans."""
    return _observe(trace, _TL)
