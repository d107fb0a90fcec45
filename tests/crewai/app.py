"""A CrewAI crew, run offline in its own virtualenv (scripts/app-venv crewai) by
tests/integration/test_derive_crewai.py: real `crewai` agents, tasks and delegation tools, the
real `openinference-instrumentation-crewai`, the real OTLP/HTTP exporter (batched) to the
endpoint given, and a scripted OpenAI-compatible server on loopback in place of the remote
model (tests/scripted_chat.py; each agent's model is its own script).

    python tests/crewai/app.py OTLP_URL

Runs four crews, one kickoff (one trace) each, and prints their trace ids as JSON:
- `billing`: triage's task delegates to billing, which answers;
- `refund`: triage's task asks refund a question, which refund answers;
- `bounce`: triage's task delegates to refund; then refund's own task delegates to triage.
  CrewAI cannot hand straight back: a coworker runs a delegated task without delegation
  tools, so the way back is a later task's delegation;
- `failing`: triage's task delegates to billing, whose model call fails (HTTP 500): CrewAI
  catches it and returns "Error executing task with agent ..." to triage as the tool's output.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crewai import LLM, Agent, Crew, Process, Task
from openinference.instrumentation.crewai import CrewAIInstrumentor
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from scripted_chat import ScriptedChat

ROLES = {"triage": "Triage", "billing": "Billing", "refund": "Refund"}


def delegate(to: str, tool: str = "delegate_work_to_coworker") -> dict[str, Any]:
    key = "question" if tool.startswith("ask") else "task"
    return {"tool": tool, "args": {key: "look at invoice 7", "context": "invoice 7",
                                   "coworker": ROLES[to]}}  # fmt: skip


ASK = "ask_question_to_coworker"
CONVERSATIONS: dict[str, dict[str, list[Any]]] = {
    "billing": {"triage": [delegate("billing"), "invoice 7 is paid"],
                "billing": ["invoice 7 is paid"]},
    "refund": {"triage": [delegate("refund", ASK), "refund 7 issued"],
               "refund": ["refund 7 issued"]},
    "bounce": {"triage": [delegate("refund"), "sent to refund", "billing answered"],
               "refund": ["not a refund", delegate("triage"), "triage answered"]},
    "failing": {"triage": [delegate("billing"), "billing is down"], "billing": ["error"]},
}  # fmt: skip


def crew(base_url: str, name: str) -> Crew:
    def agent(key: str) -> Agent:
        llm = LLM(model=f"openai/{key}", base_url=base_url, api_key="offline", max_retries=0)
        return Agent(role=ROLES[key], goal=f"answer {key} questions", backstory=f"the {key} desk",
                     llm=llm, allow_delegation=True, max_iter=3, max_retry_limit=0,
                     verbose=False)  # fmt: skip

    agents = {k: agent(k) for k in ROLES}
    tasks = [Task(description="question about invoice 7", expected_output="an answer",
                  agent=agents["triage"])]  # fmt: skip
    if name == "bounce":
        tasks.append(Task(description="follow up on invoice 7", expected_output="an answer",
                          agent=agents["refund"]))  # fmt: skip
    return Crew(agents=list(agents.values()), tasks=tasks, process=Process.sequential)


def conversation(fake: ScriptedChat, name: str) -> str:
    """Run one crew; the trace id of its kickoff."""
    fake.load(CONVERSATIONS[name])
    with trace.get_tracer("support-app").start_as_current_span("request") as outer:
        trace_id = format(outer.get_span_context().trace_id, "032x")
        crew(fake.base_url, name).kickoff()
    if fake.left():
        raise SystemExit(f"{name}: script steps not consumed: {fake.left()}")
    return trace_id


def instrument(provider: TracerProvider) -> None:
    CrewAIInstrumentor().instrument(tracer_provider=provider)


def run_all() -> dict[str, str]:
    """Every conversation; {name: trace id}."""
    with ScriptedChat() as fake:
        return {name: conversation(fake, name) for name in CONVERSATIONS}


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
