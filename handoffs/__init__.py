"""Handoff Observatory's shell, the top layer: the `handoffs` command line (`handoffs.cli`:
routing only, each package registers its own subcommands), `handoffs simulate` and
`handoffs demo` (`handoffs.demo`: serve, simulated agents and the dashboard) and the
traffic simulator (`handoffs.simulator`). Settings and store access are `foundation`'s."""

__all__ = ["__version__"]

__version__ = "0.1.0"
