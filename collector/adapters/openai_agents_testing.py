"""A scripted, offline `agents` Model: run real SDK Runners without a network or an API key.

The test double shipped beside the adapter (as OTel ships InMemorySpanExporter): each call
to `get_response` consumes the next step of the script.

A step is a list of items, each either a string (an assistant text message),
`"handoff:<agent name>"` (a function call of that agent's handoff tool, resolved from the
handoffs the SDK passes in) or `"tool:<tool name>:<arguments JSON>"` (a call of one of the
agent's tools, e.g. an `Agent.as_tool()`: `'tool:coder:{"input": "fix it"}'`; arguments
default to `{}`), or an Exception instance (raised by the call: a failing model).
Limits: no streaming (`stream_response` raises NotImplementedError); a script that runs out
raises RuntimeError naming the model; an unknown handoff target or tool raises ValueError
listing the handoffs or tools the agent has.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

__all__ = ["ScriptedModel"]

Step = Sequence[str] | BaseException
_ids = itertools.count(1)  # call ids must be unique across every model of a run


class ScriptedModel(Model):
    """A Model that answers from a script (module doc). `name` appears in errors; `calls`
    counts the get_response calls made so far."""

    def __init__(self, steps: Iterable[Step], *, name: str = "scripted") -> None:
        self._steps = list(steps)
        for i, step in enumerate(self._steps):
            if isinstance(step, str) or not isinstance(step, BaseException | Sequence):
                raise ValueError(
                    f"steps[{i}]: expected a list of items or an exception, got {step!r}"
                )
        self.name = name
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
        **_: Any,
    ) -> ModelResponse:
        if self.calls >= len(self._steps):
            raise RuntimeError(f"ScriptedModel {self.name!r}: script exhausted ({self.calls})")
        step = self._steps[self.calls]
        self.calls += 1
        if isinstance(step, BaseException):
            raise step
        out: list[Any] = []
        for item in step:
            if item.startswith("handoff:"):
                target = item.split(":", 1)[1]
                match = [h for h in handoffs if h.agent_name == target]
                if not match:
                    names = [h.agent_name for h in handoffs]
                    raise ValueError(f"ScriptedModel {self.name!r}: no handoff to {target!r}; "
                                     f"the agent has {names}")  # fmt: skip
                n = next(_ids)
                out.append(
                    ResponseFunctionToolCall(
                        id=f"fc_{n}",
                        call_id=f"call_{n}",
                        name=match[0].tool_name,
                        arguments="{}",
                        type="function_call",
                        status="completed",
                    )
                )
            elif item.startswith("tool:"):
                parts = item.split(":", 2)
                tool = parts[1]
                arguments = parts[2] if len(parts) > 2 else "{}"
                names = [getattr(t, "name", None) for t in tools]
                if tool not in names:
                    raise ValueError(f"ScriptedModel {self.name!r}: no tool {tool!r}; "
                                     f"the agent has {names}")  # fmt: skip
                n = next(_ids)
                out.append(
                    ResponseFunctionToolCall(
                        id=f"fc_{n}",
                        call_id=f"call_{n}",
                        name=tool,
                        arguments=arguments,
                        type="function_call",
                        status="completed",
                    )
                )
            else:
                out.append(
                    ResponseOutputMessage(
                        id=f"msg_{next(_ids)}",
                        content=[ResponseOutputText(text=item, type="output_text", annotations=[])],
                        role="assistant",
                        status="completed",
                        type="message",
                    )
                )
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ScriptedModel does not stream")
