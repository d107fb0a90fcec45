"""A Strands Agents swarm, run offline in its own virtualenv (scripts/app-venv strands) by
tests/integration/test_derive_strands.py: real `strands-agents` agents and `Swarm`, Strands'
built-in OpenTelemetry tracing, the real OTLP/HTTP exporter (batched) to the endpoint given, and
a scripted OpenAI-compatible chat completions server on 127.0.0.1 (a thread of this process) in
place of the remote model.

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

import itertools
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


def handoff(to: str) -> Step:
    return ("handoff_to_agent", {"agent_name": to, "message": f"over to {to}"})


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
        chat.scripts = {k: list(v) for k, v in scripts.items()}
        with trace.get_tracer("support-app").start_as_current_span(name) as outer:
            out[name] = format(outer.get_span_context().trace_id, "032x")
            result = swarm(chat.base_url)("help me")
            print(f"{name}: {result.status}", file=sys.stderr)
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
    trace.set_tracer_provider(provider)  # Strands' tracer exports through the global provider
    chat = ScriptedChat()
    try:
        ids = main(chat)
    finally:
        chat.close()
    provider.shutdown()
    print(json.dumps(ids))
