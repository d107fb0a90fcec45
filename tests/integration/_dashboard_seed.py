"""Known handoffs for the dashboard tests, written as OTel spans into {db}.otel_traces
(the materialized views fill handoff_transitions and the summary), as a stock collector would.

Day 2026-11-23 (the window under test), tenant acme unless said:
  h-ok-1   planner→coder    create accept start commit(evidence 1 valid)        committed
  h-ok-2   planner→coder    create accept start prepare(2 valid) commit         committed
  h-noev   planner→coder    create accept start commit(evidence 0, not valid)   committed w/o evidence
  h-rej    planner→coder    create reject                                        rejected
  h-unk    planner→coder    create accept timeout                                unknown
  h-esc    planner→reviewer create(mode escalate) escalate           (beta)      escalated
  h-ok-3   planner→reviewer create accept start commit(1 valid)      (beta)      committed
Day 2026-11-22 (the previous period): h-prev-1 committed, h-prev-2 rejected.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

DAY = datetime(2026, 11, 23, tzinfo=UTC)
WINDOW = {
    "from": "2026-11-23T00:00:00Z",
    "to": "2026-11-24T00:00:00Z",
    "as_of": "2026-11-30T00:00:00Z",
}
WEEK = "2026-W48"  # Monday 2026-11-23

_FLOWS = {
    "committed": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "commit",
            "running",
            "committed",
            {
                "handoff.evidence.count": "1",
                "handoff.evidence.valid": "true",
                "handoff.receipt.status": "ok",
                "handoff.receipt.hash": "r1",
            },
        ),
    ],
    "prepared": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "prepare",
            "running",
            "prepared",
            {"handoff.evidence.count": "2", "handoff.evidence.valid": "true"},
        ),
        ("commit", "prepared", "committed", {"handoff.receipt.status": "ok"}),
    ],
    "noev": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "commit",
            "running",
            "committed",
            {"handoff.evidence.count": "0", "handoff.evidence.valid": "false"},
        ),
    ],
    "rejected": [
        ("create", "", "created"),
        ("reject", "created", "rejected", {"handoff.error_code": "busy"}),
    ],
    "unknown": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("timeout", "accepted", "unknown"),
    ],
    "escalated": [("create", "", "created"), ("escalate", "created", "escalated")],
}

#: (handoff_id, flow, tenant, to_agent, mode, topology, created)
HANDOFFS = (
    ("h-ok-1", "committed", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=9)),
    ("h-ok-2", "prepared", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=10)),
    ("h-noev", "noev", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=11)),
    ("h-rej", "rejected", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=12)),
    ("h-unk", "unknown", "acme", "coder", "delegate", "agent_as_tool", DAY + timedelta(hours=13)),
    (
        "h-esc",
        "escalated",
        "beta",
        "reviewer",
        "escalate",
        "shared_queue",
        DAY + timedelta(hours=14),
    ),
    (
        "h-ok-3",
        "committed",
        "beta",
        "reviewer",
        "delegate",
        "shared_queue",
        DAY + timedelta(hours=15),
    ),
    ("h-prev-1", "committed", "acme", "coder", "delegate", "in_process", DAY - timedelta(hours=10)),
    ("h-prev-2", "rejected", "acme", "coder", "delegate", "in_process", DAY - timedelta(hours=9)),
)
IN_WINDOW = [h for h in HANDOFFS if h[6] >= DAY]

_COLUMNS = [
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "Tenant",
]


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def span_rows(handoffs=HANDOFFS) -> list[list]:
    """One row per transition, plus one non-handoff span per trace (the trace's other spans)."""
    rows: list[list] = []
    for hid, flow, tenant, to_agent, mode, topology, created in handoffs:
        trace = _hex(hid, 32)
        for i, step in enumerate(_FLOWS[flow]):
            event, frm, to = step[:3]
            extra = step[3] if len(step) > 3 else {}
            actor = "planner" if event in ("create", "timeout", "escalate") else to_agent
            attrs = {
                "handoff.task_id": f"task-{hid}",
                "handoff.handoff_id": hid,
                "handoff.event": event,
                "handoff.from_state": frm,
                "handoff.to_state": to,
                "handoff.actor": actor,
                **extra,
            }
            if event == "create":
                attrs.update(
                    {
                        "handoff.protocol": "aa-handoff/v1",
                        "handoff.mode": mode,
                        "handoff.from_agent": "planner",
                        "handoff.to_agent": to_agent,
                        "handoff.topology": topology,
                        "handoff.idempotency_key": f"idem-{hid}",
                        "handoff.capabilities": json.dumps(
                            ["code.write"] if to_agent == "coder" else ["review"]
                        ),
                        "handoff.evidence_refs": json.dumps([f"ev-{hid}"]),
                    }
                )
            rows.append(
                [
                    created + timedelta(seconds=5 * i),
                    trace,
                    _hex(f"{hid}/{i}", 16),
                    "",
                    f"handoff.{event}",
                    "Internal",
                    actor,
                    attrs,
                    1_000_000,
                    "Ok",
                    tenant,
                ]
            )
        rows.append(
            [
                created + timedelta(seconds=1),
                trace,
                _hex(f"{hid}/llm", 16),
                "",
                "llm.call",
                "Client",
                to_agent,
                {"gen_ai.operation.name": "chat"},
                2_000_000,
                "Ok",
                tenant,
            ]
        )
    return rows


def seed(client, database: str, handoffs=HANDOFFS) -> int:
    """Insert the spans; returns how many rows were written."""
    rows = span_rows(handoffs)
    client.insert(f"{database}.otel_traces", rows, column_names=_COLUMNS)
    return len(rows)
