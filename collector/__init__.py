"""The handoff instrumentation shim: contract, envelope, tracer, semantic conventions, adapters."""

from collector._redact import InputFilter
from collector.a2a import A2A_STATES, a2a_event, a2a_events
from collector.contract import (
    PROTOCOL,
    TERMINAL,
    TRANSITIONS,
    Event,
    IllegalTransition,
    State,
    next_state,
)
from collector.envelope import Envelope, EnvelopeError, EvidenceRef
from collector.recorder import InMemoryRecorder
from collector.tracer import Handoff, HandoffTracer

__all__ = [
    "A2A_STATES",
    "PROTOCOL",
    "TERMINAL",
    "TRANSITIONS",
    "Envelope",
    "EnvelopeError",
    "Event",
    "EvidenceRef",
    "Handoff",
    "HandoffTracer",
    "IllegalTransition",
    "InMemoryRecorder",
    "InputFilter",
    "State",
    "a2a_event",
    "a2a_events",
    "next_state",
]
