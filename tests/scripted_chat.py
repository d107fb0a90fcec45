"""A scripted OpenAI-compatible Chat Completions server on loopback, for the framework test
apps that run in their own virtualenvs (the apps of tests/llamaindex, crewai, strands and
pydantic_ai): only the standard library, so any venv can import it.

The test double for the remote model vendor, the one part that cannot run here. Each
request's `model` names a script (one per agent); each call consumes that script's next
step: `{"tool": NAME, "args": {...}}` answers with a call of that tool with those
arguments, `"error"` answers HTTP 500 (give the client no retries), any other string is the
assistant's text. A script that runs out answers HTTP 400 naming the model. Streaming
requests (`"stream": true`) are answered as one server-sent-events chunk plus `[DONE]`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedChat", "Step"]

Step = str | Mapping[str, Any]


class ScriptedChat:
    """Serve `POST /v1/chat/completions` from `scripts` (model name -> steps) on 127.0.0.1,
    port chosen by the OS. Use as a context manager; `base_url` ends in `/v1`."""

    def __init__(self, scripts: Mapping[str, Iterable[Step]] | None = None) -> None:
        self._scripts: dict[str, list[Step]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.load(scripts or {})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedChat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def load(self, scripts: Mapping[str, Iterable[Step]]) -> None:
        """Replace every script (one conversation's)."""
        with self._lock:
            self._scripts = {model: list(steps) for model, steps in scripts.items()}

    def left(self) -> dict[str, int]:
        """Steps not consumed yet, per model that has any."""
        with self._lock:
            return {m: len(s) for m, s in self._scripts.items() if s}

    def answer(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one chat completion request body."""
        model = str(body.get("model", "")).rsplit("/", 1)[-1]
        with self._lock:
            steps = self._scripts.get(model)
            if not steps:
                return 400, {"error": {"message": f"script of model {model!r} exhausted"}}
            step = steps.pop(0)
            n = next(self._ids)
        if step == "error":
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "stop"
        if isinstance(step, Mapping):
            call = {"name": step["tool"], "arguments": json.dumps(step.get("args", {}))}
            message["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": call}]
            finish = "tool_calls"
        else:
            message["content"] = step
        return 200, {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000 + n,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    body = {}
                status, doc = owner.answer(body)
                if status == 200 and body.get("stream"):
                    self._stream(doc)
                    return
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, doc: dict[str, Any]) -> None:
                choice = doc["choices"][0]
                delta = dict(choice["message"])
                for i, call in enumerate(delta.get("tool_calls") or []):
                    call["index"] = i
                chunk = {**doc, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta,
                                      "finish_reason": choice["finish_reason"]}]}  # fmt: skip
                raw = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        return Handler
