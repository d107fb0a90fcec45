"""A Microsoft Agent Framework handoff app, run offline in its own virtualenv
(scripts/app-venv agent_framework) by tests/integration/test_derive_agent_framework.py: real
`agent-framework` agents in a real `HandoffBuilder` workflow, the framework's own
OpenTelemetry instrumentation, the real OTLP/HTTP exporter (batched) to the endpoint given,
and a fake OpenAI-compatible chat-completions server on 127.0.0.1 (a thread of this process)
in place of the remote model: each agent's client names the agent as its model, and the
server answers each request with that agent's next scripted step.

    python tests/agent_framework/app.py OTLP_URL

Runs four conversations, one workflow run (one trace) each, and prints their trace ids as
JSON:
- `billing`: triage hands off to billing, which answers;
- `refund`: triage hands off to refund, which answers;
- `bounce`: triage hands off to refund, refund straight back to triage, which answers;
- `failing`: triage hands off to billing, whose model call fails (HTTP 400).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_framework import Agent
from agent_framework.observability import enable_instrumentation
from agent_framework.openai import OpenAIChatCompletionClient
from agent_framework_orchestrations import HandoffBuilder
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

#: agent name -> its model's next steps: "handoff:<agent>", "fail", or the answer's text
SCRIPTS: dict[str, list[str]] = {}
_LOCK = threading.Lock()


def _completion(agent: str, step: str) -> dict[str, Any]:
    if step.startswith("handoff:"):
        call = {"id": f"call_{agent}_{len(SCRIPTS[agent])}", "type": "function",
                "function": {"name": f"handoff_to_{step[8:]}", "arguments": "{}"}}  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": step}, "stop"
    return {
        "id": f"chatcmpl-{agent}", "object": "chat.completion", "created": 0, "model": agent,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }  # fmt: skip


class FakeChatCompletions(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: the next step of SCRIPTS[model] (non-streaming only)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        agent = body["model"]
        with _LOCK:
            step = SCRIPTS[agent].pop(0) if SCRIPTS.get(agent) else None
        if step is None or body.get("stream") or not self.path.endswith("/chat/completions"):
            status, reply = 500, {"error": {"message": f"unscripted request by {agent}"}}
        elif step == "fail":  # 400: the client does not retry it
            status = 400
            reply = {
                "error": {"message": "scripted model failure", "type": "invalid_request_error"}
            }
        else:
            status, reply = 200, _completion(agent, step)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def workflow(base_url: str) -> Any:
    def agent(name: str) -> Agent:
        client = OpenAIChatCompletionClient(model=name, api_key="dummy", base_url=base_url)
        return Agent(client=client, name=name, instructions=f"You are {name}.",
                     require_per_service_call_history_persistence=True)  # fmt: skip

    triage, billing, refund = agent("triage"), agent("billing"), agent("refund")
    return (
        HandoffBuilder(name="support", participants=[triage, billing, refund])
        .with_start_agent(triage)
        .build()
    )


async def conversation(base_url: str, scripts: dict[str, list[str]]) -> str:
    """Run one user message through a fresh workflow; the trace id of its run."""
    with _LOCK:
        SCRIPTS.clear()
        SCRIPTS.update({k: list(v) for k, v in scripts.items()})
    with trace.get_tracer("support-app").start_as_current_span("request") as outer:
        trace_id = format(outer.get_span_context().trace_id, "032x")
        try:
            await workflow(base_url).run("I was charged twice")
        except Exception as e:  # the failing conversation: the run re-raises the model's error
            print(f"run raised {type(e).__name__}: {e}", file=sys.stderr)
    left = {k: v for k, v in SCRIPTS.items() if v}
    if left:
        raise SystemExit(f"script steps not consumed: {left}")
    return trace_id


async def main(base_url: str) -> dict[str, str]:
    return {
        "billing": await conversation(
            base_url, {"triage": ["handoff:billing"], "billing": ["refunded the double charge"]}
        ),
        "refund": await conversation(
            base_url, {"triage": ["handoff:refund"], "refund": ["refund issued"]}
        ),
        "bounce": await conversation(
            base_url,
            {
                "triage": ["handoff:refund", "it was a billing question"],
                "refund": ["handoff:triage"],
            },
        ),
        "failing": await conversation(
            base_url, {"triage": ["handoff:billing"], "billing": ["fail"]}
        ),
    }


if __name__ == "__main__":
    provider = TracerProvider(resource=Resource.create({"service.name": "support-app"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{sys.argv[1]}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=8,
        )
    )
    trace.set_tracer_provider(provider)
    enable_instrumentation()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeChatCompletions)
    threading.Thread(target=server.serve_forever, name="fake-openai", daemon=True).start()
    try:
        ids = asyncio.run(main(f"http://127.0.0.1:{server.server_port}/v1"))
    finally:
        server.shutdown()
    provider.shutdown()
    print(json.dumps(ids))
