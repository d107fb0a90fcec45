"""A Google ADK multi-agent app, run offline in ADK's own virtualenv (scripts/app-venv adk) by
tests/integration/test_derive_adk.py: real `google-adk` agents and runner, ADK's built-in
tracing, the real OTLP/HTTP exporter (batched) to the endpoint given, and a scripted model in
place of the remote one (a BaseLlm subclass: each agent's turns are scripted steps).

    python tests/adk/app.py OTLP_URL

Runs three conversations, one workflow (one trace) each, and prints their trace ids as JSON:
- `bounce`: triage transfers to coder, coder straight back to triage, which answers
  (message content capture off: the transfer spans do not name their target);
- `failing`: triage transfers to refunds, whose model call raises;
- `named`: triage transfers to coder, which answers, with content capture on for this run
  (RunConfig.telemetry): the transfer span names its target in its arguments.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.telemetry.context import ContentCapturingMode, TelemetryConfig
from google.genai import types
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

#: agent name -> its model's next steps: "transfer:<agent>", "raise", or the answer's text
SCRIPTS: dict[str, list[str]] = {}


class ScriptedModel(BaseLlm):
    """One agent's model: answers each turn with the next step of SCRIPTS[model]."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        step = SCRIPTS[self.model].pop(0)
        if step == "raise":
            raise RuntimeError("scripted model failure")
        if step.startswith("transfer:"):
            call = types.FunctionCall(name="transfer_to_agent", args={"agent_name": step[9:]})
            part = types.Part(function_call=call)
        else:
            part = types.Part(text=step)
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def agents() -> LlmAgent:
    def agent(name: str, subs: list[LlmAgent] | None = None) -> LlmAgent:
        return LlmAgent(name=name, model=ScriptedModel(model=name), instruction=f"You are {name}.",
                        description=f"the {name} agent", sub_agents=subs or [])  # fmt: skip

    return agent("triage", [agent("coder"), agent("refunds")])


async def conversation(runner: InMemoryRunner, scripts: dict[str, list[str]], **kw: Any) -> str:
    """Run one user message through the app; the trace id of its workflow."""
    SCRIPTS.clear()
    SCRIPTS.update({k: list(v) for k, v in scripts.items()})
    session = await runner.session_service.create_session(app_name="support", user_id="u1")
    message = types.Content(role="user", parts=[types.Part(text="my build fails")])
    with trace.get_tracer("support-app").start_as_current_span("request") as outer:
        trace_id = format(outer.get_span_context().trace_id, "032x")
        try:
            async for _ in runner.run_async(user_id="u1", session_id=session.id,
                                            new_message=message, **kw):  # fmt: skip
                pass
        except RuntimeError:
            pass  # the failing conversation: the runner re-raises the model's error
    left = {k: v for k, v in SCRIPTS.items() if v}
    if left:
        raise SystemExit(f"script steps not consumed: {left}")
    return trace_id


async def main(url: str) -> dict[str, str]:
    runner = InMemoryRunner(agent=agents(), app_name="support")
    capture = RunConfig(
        telemetry=TelemetryConfig(capture_message_content=ContentCapturingMode.SPAN_ONLY)
    )
    return {
        "bounce": await conversation(
            runner, {"triage": ["transfer:coder", "ok, on it"], "coder": ["transfer:triage"]}
        ),
        "failing": await conversation(
            runner, {"triage": ["transfer:refunds"], "refunds": ["raise"]}
        ),
        "named": await conversation(
            runner, {"triage": ["transfer:coder"], "coder": ["fixed"]}, run_config=capture
        ),
    }


if __name__ == "__main__":
    provider = TracerProvider(resource=Resource.create({"service.name": "support-app"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{sys.argv[1]}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=4,
        )
    )
    trace.set_tracer_provider(provider)
    ids = asyncio.run(main(sys.argv[1]))
    provider.shutdown()
    print(json.dumps(ids))
