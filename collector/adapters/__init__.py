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

import importlib
from typing import Any

__all__ = ["A2AServerObserver", "HandoffClientInterceptor", "HandoffTracingProcessor"]

_LAZY = {
    "HandoffTracingProcessor": ("collector.adapters.openai_agents", "openai-agents"),
    "A2AServerObserver": ("collector.adapters.a2a", "a2a"),
    "HandoffClientInterceptor": ("collector.adapters.a2a", "a2a"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'collector.adapters' has no attribute {name!r}")
    module, extra = target
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # the framework is an optional extra
        raise ImportError(
            f"{name} needs the optional extra: pip install 'handoff-observatory[{extra}]' ({exc})"
        ) from exc
    return getattr(mod, name)
