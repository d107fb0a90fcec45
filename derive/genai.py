"""Handoffs in the OTel GenAI semantic conventions: a transfer recorded as an
`execute_tool` span with `gen_ai.agent.handoff.source.name` / `.target.name` (proposed
attributes), the target's run as the `invoke_agent` span that follows it.

The target's run: the first `invoke_agent` span of the target agent in the same trace that
starts at or after the tool span and is not one of its ancestors. The run ended (what is
missing will not come) once the trace's root span (no parent) is stored. Mapping table:
docs/derived-handoffs.md.
"""

from __future__ import annotations

from typing import Final

from derive._model import Observed, SpanRecord, slug
from derive._trace import Runs, Subtrees, TraceIndex, run_kinds

__all__ = ["GENAI", "SOURCE_NAME", "TARGET_NAME", "genai_rule"]

GENAI: Final = "genai.execute_tool.handoff"
SOURCE_NAME: Final = "gen_ai.agent.handoff.source.name"
TARGET_NAME: Final = "gen_ai.agent.handoff.target.name"
_OP: Final = "gen_ai.operation.name"
_AGENT: Final = "gen_ai.agent.name"
_MODEL_OPS: Final = frozenset({"chat", "text_completion", "generate_content", "execute_tool"})


def _is_invoke(s: SpanRecord) -> bool:
    return s.attr(_OP) == "invoke_agent"


def _is_transfer(s: SpanRecord) -> bool:
    return s.attr(_OP) == "execute_tool" and bool(s.attr(TARGET_NAME) or s.attr(SOURCE_NAME))


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
    runs = Runs((s for s in trace.spans if _is_invoke(s)), lambda s: (s.attr(_AGENT),))
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
        to_agent = t.attr(TARGET_NAME) or None
        nxt = None
        if to_agent is not None:
            up = {a.span_id for a in trace.ancestors(t)}
            nxt = runs.first(to_agent, t.start_ns, skip=up)
        handoff_id = f"{t.trace_id}/{t.span_id}"
        if nxt is not None:
            runs.claim(nxt)
            made_by[nxt.span_id] = handoff_id
        out.append(
            Observed(
                rule=GENAI,
                task_id=t.trace_id,
                handoff_id=handoff_id,
                causation_id=made_by.get(enclosing.span_id) if enclosing is not None else None,
                source=t,
                from_agent=from_agent,
                to_agent=to_agent,
                topology="in_process",
                target=runs_of.target(nxt, _error(nxt)) if nxt is not None else None,
                run_ended_ns=root.end_ns if root is not None else None,
            )
        )
    return out
