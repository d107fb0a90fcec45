"""Every rule, and the one pure function the pass calls per trace."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from derive._model import Derived, Observed, SpanRecord, plan
from derive._trace import TraceIndex
from derive.adk import ADK_SCOPE, adk_rule
from derive.agent_framework import AGENT_FRAMEWORK_SCOPE, agent_framework_rule
from derive.dialects import CREWAI_SCOPE, LLAMA_INDEX_SCOPE, crewai_rule, llama_index_rule
from derive.genai import genai_rule
from derive.langgraph import langgraph_rule
from derive.openai_agents import openinference_rule, openllmetry_rule
from derive.pydantic_ai import PYDANTIC_AI_SCOPE, pydantic_ai_rule
from derive.strands import STRANDS_SCOPE, strands_rule

Rule = Callable[[TraceIndex], list[Observed]]

#: instrumentation scopes the rules read; a trace is read again when a span of one of these,
#: a GenAI agent or tool span, or a root span arrives (derive._pass)
SCOPES: Final = (
    "openinference.instrumentation.openai_agents",
    "opentelemetry.instrumentation.openai_agents",
    "openinference.instrumentation.langchain",
    ADK_SCOPE,
    AGENT_FRAMEWORK_SCOPE,
    LLAMA_INDEX_SCOPE,
    CREWAI_SCOPE,
    PYDANTIC_AI_SCOPE,
    STRANDS_SCOPE,
)

#: in order; a span is read by at most one rule (the first that derives from it)
RULES: Final[tuple[Rule, ...]] = (
    openinference_rule,
    openllmetry_rule,
    langgraph_rule,
    adk_rule,
    agent_framework_rule,
    llama_index_rule,
    crewai_rule,
    pydantic_ai_rule,
    strands_rule,
    genai_rule,
)


@dataclass(frozen=True, slots=True)
class Hold:
    """When a handoff waits for a later pass instead of being derived now: its source span
    has an ancestor that is not stored (yet) and was stored less than `grace_s` seconds
    before `now_s` (seconds since the epoch, the store's clock).

    Why: a batching exporter sends a span when it ends, so the runs enclosing a handoff (whose
    agent, task and the earlier handoff that caused it the rules read) arrive after the
    handoff's own spans, often in a later request. A handoff's `create` is stored once and
    never rewritten, so derived before its enclosing run it would keep no cause for good.
    After `grace_s` it is derived with what is stored: a parent in a service that exports
    elsewhere never comes."""

    now_s: float
    grace_s: float

    def waits(self, trace: TraceIndex, source: SpanRecord) -> bool:
        return self.now_s - source.stored_s < self.grace_s and not trace.reaches_root(source)


@dataclass(frozen=True, slots=True)
class Derivation:
    """What one tenant's spans of one trace derive now, and how many handoffs wait (`Hold`)."""

    transitions: tuple[Derived, ...]
    held: int = 0


def derivation(
    spans: Iterable[SpanRecord], rules: Iterable[Rule] = RULES, hold: Hold | None = None
) -> Derivation:
    """The derived transitions of one tenant's stored spans of one trace, deterministic
    (same spans and hold, same output, same span ids). Nothing when those spans hold handoff
    transitions that were not derived (the shim's or an adapter's): those count, derivation
    would double them. A handoff `hold` holds is counted, not derived. Raises ValueError on
    spans of more than one (tenant, trace id): each tenant's spans are derived alone
    (derive._pass.derive_traces groups them)."""
    trace = TraceIndex(spans)
    if len({(s.tenant, s.trace_id) for s in trace.spans}) > 1:
        raise ValueError("spans of more than one (tenant, trace id): derive each apart")
    if trace.has_handoff_spans_not_derived():
        return Derivation(())
    out: list[Derived] = []
    held = 0
    seen_sources: set[str] = set()
    seen_ids: set[str] = set()
    for rule in rules:
        for o in rule(trace):
            if o.source.span_id in seen_sources:
                continue
            seen_sources.add(o.source.span_id)
            if hold is not None and hold.waits(trace, o.source):
                held += 1
                continue
            for d in plan(o):
                if d.span_id not in seen_ids:
                    seen_ids.add(d.span_id)
                    out.append(d)
    return Derivation(tuple(out), held)


def derive_trace(spans: Iterable[SpanRecord], rules: Iterable[Rule] = RULES) -> list[Derived]:
    """`derivation(spans, rules)`'s transitions: everything the spans show, nothing held."""
    return list(derivation(spans, rules).transitions)
