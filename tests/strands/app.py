"""A Strands Agents swarm, run offline in its own virtualenv (scripts/app-venv strands) by
tests/integration/test_derive_strands.py: real `strands-agents` agents and `Swarm`, Strands'
built-in OpenTelemetry tracing, the real OTLP/HTTP exporter (batched) to the endpoint given, and
a scripted OpenAI-compatible chat completions server on 127.0.0.1 (tests/scripted_chat.py, a
thread of this process) in place of the remote model.

    python tests/strands/app.py OTLP_URL [latest]

`latest`: run with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental (the handoff's
target in `gen_ai.tool.call.arguments`); without it Strands names the target only in the tool
span's `gen_ai.tool.message` event. A node hands off by calling the swarm's own
`handoff_to_agent` tool. Runs four conversations, one swarm (one trace) each, and prints their
trace ids as JSON:
- `billing`: triage hands off to billing, which answers;
- `refund`: triage hands off to refund, which answers;
- `bounce`: triage hands off to refund, refund straight back to triage, which answers;
- `failing`: triage hands off to billing, whose model call gets HTTP 500.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if sys.argv[2:] == ["latest"]:  # read by Strands' tracer when it is built: before the import
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from strands import Agent
from strands.models.openai import OpenAIModel
from strands.multiagent import Swarm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the scripted model
from scripted_chat import ScriptedChat, Step


def handoff(to: str) -> Step:
    return {"tool": "handoff_to_agent", "args": {"agent_name": to, "message": f"over to {to}"}}


CONVERSATIONS: dict[str, dict[str, list[Step]]] = {
    "billing": {
        "triage": [handoff("billing"), "handed over"],
        "billing": ["one charge was a hold"],
    },
    "refund": {"triage": [handoff("refund"), "handed over"], "refund": ["refund 7 issued"]},
    "bounce": {
        "triage": [handoff("refund"), "handed over", "your plan is billing's"],
        "refund": [handoff("triage"), "not mine"],
    },
    "failing": {"triage": [handoff("billing"), "handed over"], "billing": ["error"]},
}


def swarm(base_url: str) -> Swarm:
    """triage (the entry point), billing and refund, each on its own scripted model."""

    def agent(name: str) -> Agent:
        model = OpenAIModel(
            client_args={"base_url": base_url, "api_key": "offline", "max_retries": 0},
            model_id=name,
            params={"stream": False},
        )
        return Agent(name=name, model=model, system_prompt=f"You are the {name} agent.",
                     callback_handler=None)  # fmt: skip

    return Swarm([agent("triage"), agent("billing"), agent("refund")], max_handoffs=5)


def main(chat: ScriptedChat) -> dict[str, str]:
    out = {}
    for name, scripts in CONVERSATIONS.items():
        chat.load(scripts)
        with trace.get_tracer("support-app").start_as_current_span(name) as outer:
            out[name] = format(outer.get_span_context().trace_id, "032x")
            result = swarm(chat.base_url)("help me")
            print(f"{name}: {result.status}", file=sys.stderr)
        if left := chat.left():
            raise SystemExit(f"{name}: script steps not consumed: {left}")
    return out


if __name__ == "__main__":
    provider = TracerProvider(resource=Resource.create({"service.name": "support-app"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{sys.argv[1]}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=4,
        )
    )
    trace.set_tracer_provider(provider)  # Strands' tracer exports through the global provider
    with ScriptedChat() as chat:
        ids = main(chat)
    provider.shutdown()
    print(json.dumps(ids))
