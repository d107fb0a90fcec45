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
import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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

#: a step of a model's script: (tool name, arguments) calls that tool, "error" answers HTTP
#: 500, any other text is the assistant's answer
Step = tuple[str, dict[str, Any]] | str


class ScriptedChat:
    """`POST /v1/chat/completions` on 127.0.0.1 (port 0): each request's `model` names a
    script, each call takes its next step. No streaming."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Step]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, doc = owner.answer(body)
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        model = str(body.get("model", ""))
        with self._lock:
            steps = self.scripts.get(model)
            if not steps:
                return 400, {"error": {"message": f"script of {model!r} exhausted"}}
            step, n = steps.pop(0), next(self._ids)
        if step == "error":
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(step, tuple):
            call = {"name": step[0], "arguments": json.dumps(step[1])}
            message["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": call}]
        else:
            message["content"] = step
        finish = "tool_calls" if isinstance(step, tuple) else "stop"
        return 200, {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000 + n,
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }  # fmt: skip


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
        "triage": [("ask_billing", {"question": "why two charges?"}), "refunded the double"],
        "billing": ["one charge was a hold"],
    },
    "refund": {
        "triage": [("ask_refund", {"question": "refund order 7"}), "refund issued"],
        "refund": ["refund 7 issued"],
    },
    "bounce": {
        "triage": [("ask_refund", {"question": "refund my plan"}), "plan is billing's", "done"],
        "refund": [("ask_triage", {"question": "is this a refund?"}), "not mine"],
    },
    "failing": {
        "triage": [("ask_billing", {"question": "invoice 9?"})],
        "billing": ["error"],
    },
}


async def main(chat: ScriptedChat, client: AsyncOpenAI) -> dict[str, str]:
    triage = agents(client)
    out = {}
    for name, scripts in CONVERSATIONS.items():
        chat.scripts = {k: list(v) for k, v in scripts.items()}
        with trace.get_tracer("support-app").start_as_current_span(name) as outer:
            out[name] = format(outer.get_span_context().trace_id, "032x")
            try:
                await triage.run("help me")
            except Exception as e:  # the failing conversation: the model's 500, re-raised
                if name != "failing":
                    raise
                print(f"{name}: {type(e).__name__}", file=sys.stderr)
        left = {k: v for k, v in chat.scripts.items() if v}
        if left:
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
    chat = ScriptedChat()
    client = AsyncOpenAI(base_url=chat.base_url, api_key="offline", max_retries=0)
    try:
        ids = asyncio.run(main(chat, client))
    finally:
        chat.close()
    provider.shutdown()
    print(json.dumps(ids))
