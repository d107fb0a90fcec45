"""Adapters that map other agent frameworks onto the handoff state machine.

Each adapter imports its framework lazily (only when you import the adapter module), so
`import collector` never needs the optional extras:

- `collector.adapters.openai_agents` (extra `[openai-agents]`): `HandoffTracingProcessor`, a
  tracing processor for the OpenAI Agents SDK; docs/adapters-openai-agents.md.
- `collector.adapters.a2a` (extra `[a2a]`): `A2AServerObserver` (task store + request handler
  wrappers) and `HandoffClientInterceptor` for the A2A SDK; docs/adapters-a2a.md.

The names below are resolved on first attribute access (PEP 562), importing the framework
then; an ImportError names the extra to install.
"""

from __future__ import annotations

from foundation.lazy import lazy_exports

__all__ = ["A2AServerObserver", "HandoffClientInterceptor", "HandoffTracingProcessor"]

_WHERE = {
    "HandoffTracingProcessor": "collector.adapters.openai_agents",
    "A2AServerObserver": "collector.adapters.a2a",
    "HandoffClientInterceptor": "collector.adapters.a2a",
}
lazy_exports(
    __name__,
    _WHERE,
    extras={"collector.adapters.openai_agents": "openai-agents", "collector.adapters.a2a": "a2a"},
)
