"""A LlamaIndex AgentWorkflow app, run offline in its own virtualenv (scripts/app-venv
llamaindex) by tests/integration/test_derive_llamaindex.py: real `llama-index-core` agents
and workflow, the real `openinference-instrumentation-llama-index`, the real OTLP/HTTP
exporter (batched) to the endpoint given, and a scripted OpenAI-compatible server on loopback
in place of the remote model (tests/scripted_chat.py; each agent's model is its own script).

    python tests/llamaindex/app.py OTLP_URL

Runs four conversations, one `AgentWorkflow.run` (one trace) each, and prints their trace
ids as JSON:
- `billing`: triage hands off to billing, which answers;
- `refund`: triage hands off to refund, which answers;
- `bounce`: triage hands off to refund, refund straight back to triage, which answers;
- `failing`: triage hands off to billing, whose model call fails (HTTP 500).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.llms.openai_like import OpenAILike
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from scripted_chat import ScriptedChat


def handoff(to: str) -> dict[str, Any]:
    return {"tool": "handoff", "args": {"to_agent": to, "reason": f"{to} handles this"}}


CONVERSATIONS: dict[str, dict[str, list[Any]]] = {
    "billing": {"triage": [handoff("billing")], "billing": ["invoice 7 is paid"]},
    "refund": {"triage": [handoff("refund")], "refund": ["refund 7 issued"]},
    "bounce": {
        "triage": [handoff("refund"), "this is a billing question: invoice 7 is paid"],
        "refund": [handoff("triage")],
    },
    "failing": {"triage": [handoff("billing")], "billing": ["error"]},
}


def workflow(base_url: str) -> AgentWorkflow:
    def agent(name: str, to: list[str]) -> FunctionAgent:
        llm = OpenAILike(model=name, api_base=base_url, api_key="offline", is_chat_model=True,
                         is_function_calling_model=True, max_retries=0, timeout=10)  # fmt: skip
        return FunctionAgent(name=name, description=f"the {name} agent", llm=llm,
                             system_prompt=f"You are {name}.", can_handoff_to=to)  # fmt: skip

    agents = [agent("triage", ["billing", "refund"]), agent("billing", ["triage"]),
              agent("refund", ["triage"])]  # fmt: skip
    return AgentWorkflow(agents=agents, root_agent="triage")


async def conversation(fake: ScriptedChat, name: str) -> str:
    """Run one user message through a new workflow; the trace id of its run."""
    fake.load(CONVERSATIONS[name])
    with trace.get_tracer("support-app").start_as_current_span("request") as outer:
        trace_id = format(outer.get_span_context().trace_id, "032x")
        try:
            await workflow(fake.base_url).run(user_msg="question about invoice 7")
        except Exception as exc:  # the failing conversation: the run re-raises the model's
            if name != "failing":
                raise
            print(f"{name}: the run raised {type(exc).__name__}", file=sys.stderr)
    if fake.left():
        raise SystemExit(f"script steps not consumed: {fake.left()}")
    return trace_id


async def main() -> dict[str, str]:
    with ScriptedChat() as fake:
        return {name: await conversation(fake, name) for name in CONVERSATIONS}


def instrument(provider: TracerProvider) -> None:
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)


def run_all() -> dict[str, str]:
    """Every conversation; {name: trace id}."""
    return asyncio.run(main())


if __name__ == "__main__":
    provider = TracerProvider(resource=Resource.create({"service.name": "support-app"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{sys.argv[1]}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=16,
        )
    )
    trace.set_tracer_provider(provider)
    instrument(provider)
    ids = run_all()
    provider.shutdown()
    print(json.dumps(ids))
