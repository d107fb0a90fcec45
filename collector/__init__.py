"""The handoff instrumentation shim: contract, envelope, tracer, semantic conventions, adapters."""

from collector.contract import PROTOCOL, TERMINAL, TRANSITIONS, Event, IllegalTransition, State, next_state

__all__ = ["PROTOCOL", "TERMINAL", "TRANSITIONS", "Event", "IllegalTransition", "State", "next_state"]
