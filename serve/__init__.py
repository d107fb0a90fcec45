"""`handoffs serve`: the process that wires ingest's receivers, spool and writer to a store,
and serves the read-only ClickHouse query port (its SQL guard, limits and engine handles).

Public: ServeConfig, run_serve; serve.testing runs a serve as a subprocess (tests, demo,
benchmarks).
"""

from typing import TYPE_CHECKING

from foundation.lazy import lazy_exports

# Lazy (PEP 562): the CLI's routing imports serve._cli without the servers and the engine.
_WHERE = {"ServeConfig": "serve._run", "run_serve": "serve._run"}


lazy_exports(__name__, _WHERE)

if TYPE_CHECKING:
    from serve._run import ServeConfig, run_serve

__all__ = ["ServeConfig", "run_serve"]
