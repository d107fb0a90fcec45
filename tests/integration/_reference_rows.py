"""Seeded transitions (tests.analytics_seed.T) as the rows the pure-Python references take
(analytics.oracle.funnel*): the handoff_transitions columns, the attribute map as stored."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.analytics_seed import T, span_rows

__all__ = ["reference_rows"]


def reference_rows(transitions: Iterable[T]) -> list[dict[str, Any]]:
    """One reference row per seeded transition, in order."""
    ts = list(transitions)
    out = []
    for t, (time_ns, trace, span, _n, _s, attributes, _t) in zip(ts, span_rows(ts), strict=True):
        a = t.attrs
        create = t.event == "create"
        out.append(
            {
                "tenant": t.tenant,
                "task_id": attributes["handoff.task_id"],
                "handoff_id": t.handoff_id,
                "event": t.event,
                "from_state": t.from_state,
                "to_state": t.to_state,
                "actor": t.actor,
                "valid": a.get("handoff.valid", True),
                "time_ns": time_ns,
                "to_agent": a.get("handoff.to_agent", ""),
                "from_agent": a.get("handoff.from_agent", ""),
                "topology": a.get("handoff.topology", ""),
                "capabilities": list(a.get("handoff.capabilities", [])),
                "error_code": a.get("handoff.error_code", ""),
                "deadline_ms": a.get("handoff.deadline_ms") if create else None,
                "mode": a.get("handoff.mode", "") if create else "",
                "evidence_count": a.get("handoff.evidence.count"),
                "evidence_valid": a.get("handoff.evidence.valid"),
                "trace_id": trace,
                "span_id": span,
                "attributes": attributes,
            }
        )
    return out
