"""A scripted OpenAI-compatible Chat Completions server on loopback: run real agent
frameworks and their real instrumentations offline (no network, no API key).

The test double for the remote model vendor, the one part that cannot run here. Each
request's `model` names a script (one per agent); each call consumes that script's next
step. A step is a string: `"tool:<name>"` answers with a call of that tool (e.g.
`"tool:transfer_to_coder"`; `"tool:a|b"` calls both at once), `"error"` answers HTTP 500 (give the client max_retries=0),
anything else is the assistant's text. Limits: no streaming; a script that runs out answers
HTTP 400 naming the model; `requests` keeps every request body received, in order.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedOpenAI"]


class ScriptedOpenAI:
    """Serve `POST /v1/chat/completions` from `scripts` (model name -> steps) on 127.0.0.1.

    Use as a context manager; `base_url` is what an OpenAI client takes (`.../v1`)."""

    def __init__(self, scripts: Mapping[str, Iterable[str]]) -> None:
        self._scripts = {model: list(steps) for model, steps in scripts.items()}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def left(self, model: str) -> int:
        """Steps of `model`'s script not consumed yet."""
        with self._lock:
            return len(self._scripts.get(model, []))

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one chat completion request body."""
        model = str(body.get("model", ""))
        with self._lock:
            self.requests.append(body)
            steps = self._scripts.get(model)
            if not steps:
                return 400, {"error": {"message": f"script of model {model!r} exhausted"}}
            step = steps.pop(0)
            n = next(self._ids)
        if step == "error":
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "stop"
        if step.startswith("tool:"):
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": "{}"},
                }
                for i, name in enumerate(step[5:].split("|"))
            ]
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
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        return Handler
