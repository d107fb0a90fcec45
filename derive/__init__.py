"""Zero-code intake: wire-contract handoff transitions derived from the spans agent
frameworks already export (OpenAI Agents SDK via OpenInference and OpenLLMetry, LangGraph
via OpenInference, Google ADK's own tracing, OTel GenAI conventions).

Rules are pure functions over frozen span records (one module per source); `derive_trace`
runs them over one tenant's spans of one trace, `derive_traces` over each (tenant, trace id)
apart; `DerivePass` is the idempotent pass serve runs every few seconds over recently stored
traces, tenant by tenant in fair turns, submitting derived spans through the normal ingest
path.
Mapping tables and limits: docs/derived-handoffs.md.
"""

from __future__ import annotations

from derive._model import DERIVED_BY, DERIVED_FROM, Derived, Observed, SpanEvent, SpanRecord, plan
from derive._otlp import SCOPE, encode
from derive._pass import (
    DERIVE_EVERY_S,
    DERIVE_HOLD_S,
    HOLD_S,
    PASS_SPANS,
    TURN_SPANS,
    DerivePass,
    PassResult,
    derive_traces,
    new_transitions,
)
from derive._rules import RULES, derive_trace
from derive._trace import TraceIndex

__all__ = [
    "DERIVED_BY",
    "DERIVED_FROM",
    "DERIVE_EVERY_S",
    "DERIVE_HOLD_S",
    "HOLD_S",
    "PASS_SPANS",
    "RULES",
    "SCOPE",
    "TURN_SPANS",
    "DerivePass",
    "Derived",
    "Observed",
    "PassResult",
    "SpanEvent",
    "SpanRecord",
    "TraceIndex",
    "derive_trace",
    "derive_traces",
    "encode",
    "new_transitions",
    "plan",
]
