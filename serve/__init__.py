"""`handoffs serve`: the process that wires ingest's receivers, spool and writer to a store,
and serves the read-only ClickHouse query port (its SQL guard, limits and engine handles).

Public: ServeConfig, run_serve; serve.testing runs a serve as a subprocess (tests, demo,
benchmarks).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Lazy (PEP 562): the CLI's routing imports serve._cli without the servers and the engine.
_WHERE = {"ServeConfig": "_run", "run_serve": "_run"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"serve.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'serve' has no attribute {name!r}")


if TYPE_CHECKING:
    from serve._run import ServeConfig, run_serve

__all__ = ["ServeConfig", "run_serve"]
