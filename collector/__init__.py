"""The handoff instrumentation shim: contract, envelope, tracer, semantic conventions, adapters.

The names below load on first use (PEP 562): `handoffs serve` needs only the contract and
the semantic conventions (collector.contract, collector.semconv), not the OpenTelemetry SDK
that the tracer and the recorder bring in (~6 MB of serve's memory, ~60 ms of start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foundation.lazy import lazy_exports

if TYPE_CHECKING:
    from collector._payload import envelope_payload_hash, payload_hash
    from collector._redact import InputFilter
    from collector._topology import (
        AgentCardRef,
        Compatibility,
        Enqueued,
        FilteredHistory,
        HistoryReport,
        QueuePosition,
        ResultItems,
        compatibility,
        filter_history,
        is_replaying,
        replaying,
        result_items,
    )
    from collector.a2a import A2A_STATES, a2a_event, a2a_events
    from collector.contract import (
        PROTOCOL,
        TERMINAL,
        TRANSITIONS,
        Event,
        IllegalTransition,
        RetryRefused,
        State,
        next_state,
    )
    from collector.envelope import Envelope, EnvelopeError, EvidencePolicy, EvidenceRef, Grant
    from collector.recorder import InMemoryRecorder
    from collector.tracer import Handoff, HandoffTracer

#: exported name -> the module that defines it
_WHERE = {
    "envelope_payload_hash": "collector._payload",
    "payload_hash": "collector._payload",
    "InputFilter": "collector._redact",
    "AgentCardRef": "collector._topology",
    "Compatibility": "collector._topology",
    "FilteredHistory": "collector._topology",
    "HistoryReport": "collector._topology",
    "Enqueued": "collector._topology",
    "QueuePosition": "collector._topology",
    "ResultItems": "collector._topology",
    "compatibility": "collector._topology",
    "filter_history": "collector._topology",
    "is_replaying": "collector._topology",
    "replaying": "collector._topology",
    "result_items": "collector._topology",
    "A2A_STATES": "collector.a2a",
    "a2a_event": "collector.a2a",
    "a2a_events": "collector.a2a",
    "PROTOCOL": "collector.contract",
    "TERMINAL": "collector.contract",
    "TRANSITIONS": "collector.contract",
    "Event": "collector.contract",
    "IllegalTransition": "collector.contract",
    "RetryRefused": "collector.contract",
    "State": "collector.contract",
    "next_state": "collector.contract",
    "Envelope": "collector.envelope",
    "EnvelopeError": "collector.envelope",
    "EvidencePolicy": "collector.envelope",
    "EvidenceRef": "collector.envelope",
    "Grant": "collector.envelope",
    "InMemoryRecorder": "collector.recorder",
    "Handoff": "collector.tracer",
    "HandoffTracer": "collector.tracer",
}

__all__ = [
    "A2A_STATES",
    "PROTOCOL",
    "TERMINAL",
    "TRANSITIONS",
    "AgentCardRef",
    "Compatibility",
    "Enqueued",
    "Envelope",
    "EnvelopeError",
    "Event",
    "EvidencePolicy",
    "EvidenceRef",
    "FilteredHistory",
    "Grant",
    "Handoff",
    "HandoffTracer",
    "HistoryReport",
    "IllegalTransition",
    "InMemoryRecorder",
    "InputFilter",
    "QueuePosition",
    "ResultItems",
    "RetryRefused",
    "State",
    "a2a_event",
    "a2a_events",
    "compatibility",
    "envelope_payload_hash",
    "filter_history",
    "is_replaying",
    "next_state",
    "payload_hash",
    "replaying",
    "result_items",
]


lazy_exports(__name__, _WHERE)
