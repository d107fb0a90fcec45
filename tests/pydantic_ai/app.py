"""A Pydantic AI multi-agent app, run offline in its own virtualenv (scripts/app-venv
pydantic_ai) by tests/integration/test_derive_pydantic_ai.py: real `pydantic-ai` agents with
Pydantic AI's built-in instrumentation (`Agent.instrument_all`), the real OTLP/HTTP exporter
(batched) to the endpoint given, and a scripted OpenAI-compatible chat completions server on
127.0.0.1 (a thread of this process) in place of the remote model.

    python tests/pydantic_ai/app.py OTLP_URL [VERSION]

VERSION: Pydantic AI's instrumentation format version (default 5). Delegation is the
framework's own pattern: a tool of the calling agent runs another agent and returns its
output (control comes back to the caller). Runs four conversations, one trace each, and
prints their trace ids as JSON:
- `billing`: triage asks billing, which answers;
- `refund`: triage asks refund, which answers;
- `bounce`: triage asks refund, refund asks triage back, which answers;
- `failing`: triage asks billing, whose model call gets HTTP 500.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from openai import AsyncOpenAI
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the scripted model
from scripted_chat import ScriptedChat, Step


def agents(client: AsyncOpenAI) -> Agent[None, str]:
    """triage, which can ask billing or refund; refund, which can ask triage back."""

    def agent(name: str) -> Agent[None, str]:
        model = OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client))
        return Agent(model, name=name, instructions=f"You are the {name} agent.")

    triage, billing, refund = agent("triage"), agent("billing"), agent("refund")

    @triage.tool
    async def ask_billing(ctx: RunContext[None], question: str) -> str:
        """Ask the billing agent."""
        return (await billing.run(question, usage=ctx.usage)).output

    @triage.tool
    async def ask_refund(ctx: RunContext[None], question: str) -> str:
        """Ask the refund agent."""
        return (await refund.run(question, usage=ctx.usage)).output

    @refund.tool
    async def ask_triage(ctx: RunContext[None], question: str) -> str:
        """Ask the triage agent."""
        return (await triage.run(question, usage=ctx.usage)).output

    return triage


CONVERSATIONS: dict[str, dict[str, list[Step]]] = {
    "billing": {
        "triage": [
            {"tool": "ask_billing", "args": {"question": "why two charges?"}},
            "refunded the double",
        ],
        "billing": ["one charge was a hold"],
    },
    "refund": {
        "triage": [{"tool": "ask_refund", "args": {"question": "refund order 7"}}, "refund issued"],
        "refund": ["refund 7 issued"],
    },
    "bounce": {
        "triage": [
            {"tool": "ask_refund", "args": {"question": "refund my plan"}},
            "plan is billing's",
            "done",
        ],
        "refund": [{"tool": "ask_triage", "args": {"question": "is this a refund?"}}, "not mine"],
    },
    "failing": {
        "triage": [{"tool": "ask_billing", "args": {"question": "invoice 9?"}}],
        "billing": ["error"],
    },
}


async def main(chat: ScriptedChat, client: AsyncOpenAI) -> dict[str, str]:
    triage = agents(client)
    out = {}
    for name, scripts in CONVERSATIONS.items():
        chat.load(scripts)
        with trace.get_tracer("support-app").start_as_current_span(name) as outer:
            out[name] = format(outer.get_span_context().trace_id, "032x")
            try:
                await triage.run("help me")
            except Exception as e:  # the failing conversation: the model's 500, re-raised
                if name != "failing":
                    raise
                print(f"{name}: {type(e).__name__}", file=sys.stderr)
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
    trace.set_tracer_provider(provider)
    version = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider, version=version))
    with ScriptedChat() as chat:
        client = AsyncOpenAI(base_url=chat.base_url, api_key="offline", max_retries=0)
        ids = asyncio.run(main(chat, client))
    provider.shutdown()
    print(json.dumps(ids))
