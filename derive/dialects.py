"""Framework dialects as tables (derive._dialect): each is a `Dialect` value, read by the one
generic rule. Mapping tables and what cannot be seen: docs/derived-handoffs.md.

- LlamaIndex AgentWorkflow, as `openinference-instrumentation-llama-index` exports it: no
  attribute names an agent. The handoff is the `handoff` tool (`FunctionTool.acall`, its
  arguments in `input.value` as `{"kwargs": {"to_agent": ...}}`); the current agent shows
  only in the reprs of the workflow's steps (`current_agent_name='...'` in the input of
  `run_agent_step`), so the source is the agent of the step that ran before the tool call,
  and the target's run is the first later step of the same `AgentWorkflow.run` whose agent
  is the target.
- CrewAI, as `openinference-instrumentation-crewai` exports it: delegation is the
  `Delegate work to coworker` (or `Ask question to coworker`) tool span under the
  delegating agent's task span (`graph.node.id` = its role), naming the coworker by role in
  `input.value`. The coworker's run has no span: the tool's end and output are the result,
  and CrewAI catches the coworker's failure and returns it as the tool's output (status OK)
  beginning "Error executing task with agent".
"""

from __future__ import annotations

from typing import Final

from derive._dialect import (
    Dialect,
    Failure,
    Find,
    Handoff,
    NextRun,
    Read,
    Spans,
    ToolResult,
    dialect_rule,
)

__all__ = [
    "CREWAI",
    "CREWAI_SCOPE",
    "LLAMA_INDEX",
    "LLAMA_INDEX_SCOPE",
    "crewai_rule",
    "llama_index_rule",
]

_KIND: Final = "openinference.span.kind"

LLAMA_INDEX_SCOPE: Final = "openinference.instrumentation.llama_index"
_LI_STEP: Final = Spans(LLAMA_INDEX_SCOPE, suffixes=(".run_agent_step",))
_LI_AGENT: Final = Read("input.value", pattern=r"current_agent_name='([^']+)'")

LLAMA_INDEX: Final = Dialect(
    rule="openinference.llama_index.handoff",
    scope=LLAMA_INDEX_SCOPE,
    handoffs=(
        Handoff(Spans(LLAMA_INDEX_SCOPE, attrs=((_KIND, "TOOL"), ("tool.name", "handoff")))),
    ),
    target=(Find(Read("input.value", path=("kwargs", "to_agent"))),),
    source=(Find(_LI_AGENT, "before", _LI_STEP),),
    outcome=NextRun(_LI_STEP, agent=(Find(_LI_AGENT),)),
    workflow=Spans(LLAMA_INDEX_SCOPE, names=("AgentWorkflow.run",)),
    failure=Failure(tools=Spans(LLAMA_INDEX_SCOPE, attrs=((_KIND, "TOOL"),))),
    evidence=(
        Spans(LLAMA_INDEX_SCOPE, attrs=((_KIND, "LLM"),)),
        Spans(LLAMA_INDEX_SCOPE, attrs=((_KIND, "TOOL"),)),
    ),
)

CREWAI_SCOPE: Final = "openinference.instrumentation.crewai"
#: how CrewAI reports a coworker's failure to the delegating agent (the tool's output)
CREWAI_FAILED: Final = "Error executing task with agent"

CREWAI: Final = Dialect(
    rule="openinference.crewai.delegation",
    scope=CREWAI_SCOPE,
    handoffs=(
        Handoff(
            Spans(
                CREWAI_SCOPE, attrs=((_KIND, "TOOL"), ("tool.name", "Delegate work to coworker"))
            ),
            mode="delegate",
        ),
        Handoff(
            Spans(CREWAI_SCOPE, attrs=((_KIND, "TOOL"), ("tool.name", "Ask question to coworker"))),
            mode="consult",
        ),
    ),
    target=(Find(Read("input.value", path=("coworker",))),),
    source=(
        Find(Read("graph.node.id"), "ancestor", Spans(CREWAI_SCOPE, attrs=((_KIND, "AGENT"),))),
    ),
    outcome=ToolResult(),
    workflow=Spans(CREWAI_SCOPE, suffixes=(".kickoff",), attrs=((_KIND, "CHAIN"),)),
    failure=Failure(output_prefixes=(CREWAI_FAILED,)),
    evidence=(Spans(CREWAI_SCOPE, attrs=((_KIND, "LLM"),)),),
)

llama_index_rule: Final = dialect_rule(LLAMA_INDEX)
crewai_rule: Final = dialect_rule(CREWAI)
