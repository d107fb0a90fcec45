"""Seed handoff transitions straight into a test database (no serve needed).

Rows go into {db}.otel_traces as the OTel Collector's exporter would write them, so the
real materialized views fill handoff_transitions and handoff_summary; then a ledger row per
transition is written with foundation.integrity.row_hash, as serve does. Shared by the
analytics and dashboard tests:

    from tests.analytics_seed import T, create, seed
    seed(client, db, [create("h1", at, task_id="t1", mode="delegate", from_agent="a",
                             to_agent="b"), T("h1", "accept", "created", "accepted", at + 1s)])
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from foundation.integrity import row_hash

__all__ = ["T", "create", "seed", "span_rows"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class T:
    """One transition to seed. `attrs` are extra span attributes by wire name (values str,
    int, bool or list[str]); `span_id` defaults to a hash of the other fields plus `copy`,
    so a duplicate delivery is the same T seeded twice with copy=1, and the same T seeded
    again unchanged is one span resent (stored twice, counted once)."""

    handoff_id: str
    event: str
    from_state: str
    to_state: str
    at: datetime
    task_id: str = ""
    actor: str = "agent"
    tenant: str = "default"
    attrs: Mapping[str, Any] = field(default_factory=dict)
    span_id: str | None = None
    trace_id: str | None = None
    copy: int = 0


def create(
    handoff_id: str,
    at: datetime,
    *,
    task_id: str,
    mode: str = "delegate",
    from_agent: str = "planner",
    to_agent: str = "worker",
    topology: str = "in_process",
    deadline_ms: int | None = None,
    capabilities: Iterable[str] = (),
    idempotency_key: str | None = None,
    payload_hash: str | None = None,
    tenant: str = "default",
    **extra: Any,
) -> T:
    """The `create` transition carrying the envelope attributes."""
    attrs: dict[str, Any] = {
        "handoff.protocol": "aa-handoff/v1",
        "handoff.mode": mode,
        "handoff.from_agent": from_agent,
        "handoff.to_agent": to_agent,
        "handoff.topology": topology,
        "handoff.capabilities": list(capabilities),
    }
    if deadline_ms is not None:
        attrs["handoff.deadline_ms"] = deadline_ms
    if idempotency_key is not None:
        attrs["handoff.idempotency_key"] = idempotency_key
    if payload_hash is not None:
        attrs["handoff.payload_hash"] = payload_hash
    attrs.update(extra)
    return T(handoff_id, "create", "", "created", at, task_id=task_id, actor=from_agent,
             tenant=tenant, attrs=attrs)  # fmt: skip


def _enc(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return json.dumps([str(x) for x in v])
    return str(v)


def _ns(t: datetime) -> int:
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def span_rows(transitions: Iterable[T]) -> list[list[Any]]:
    """otel_traces rows [Timestamp ns, TraceId, SpanId, SpanName, ServiceName, attrs, Tenant]."""
    out = []
    tasks: dict[str, str] = {}  # a transition without task_id takes its handoff's task
    for t in transitions:
        task = t.task_id or tasks.get(t.handoff_id) or f"task-{t.handoff_id}"
        tasks.setdefault(t.handoff_id, task)
        attrs = {
            "handoff.task_id": task,
            "handoff.handoff_id": t.handoff_id,
            "handoff.event": t.event,
            "handoff.from_state": t.from_state,
            "handoff.to_state": t.to_state,
            "handoff.actor": t.actor,
        }
        attrs.update({k: _enc(v) for k, v in t.attrs.items()})
        span = (
            t.span_id
            or hashlib.sha256(
                f"{t.tenant}|{t.handoff_id}|{t.event}|{t.from_state}|{t.to_state}|{t.copy}".encode()
            ).hexdigest()[:16]
        )
        trace = t.trace_id or hashlib.sha256(t.handoff_id.encode()).hexdigest()[:32]
        out.append([_ns(t.at), trace, span, f"handoff.{t.event}", t.actor, attrs, t.tenant])
    return out


def _identity(tenant: str, span_id: str, time_ns: int, attrs: Mapping[str, Any]) -> tuple:
    return (
        tenant,
        span_id,
        int(time_ns),
        tuple(sorted((str(k), str(v)) for k, v in attrs.items())),
    )


def seed(client, database: str, transitions: Iterable[T], *, ledger: bool = True) -> list[str]:
    """Insert the transitions (one INSERT) and, when `ledger`, their transition_ledger rows.

    Returns the span ids in input order."""
    rows = span_rows(transitions)
    if not rows:
        return []
    client.insert(
        f"{database}.otel_traces",
        [
            [
                datetime.fromtimestamp(r[0] // 1_000_000_000, UTC).replace(
                    microsecond=(r[0] % 1_000_000_000) // 1000
                ),
                *r[1:],
            ]
            for r in rows
        ],
        column_names=[
            "Timestamp",
            "TraceId",
            "SpanId",
            "SpanName",
            "ServiceName",
            "SpanAttributes",
            "Tenant",
        ],
    )
    spans = [r[2] for r in rows]
    if ledger:
        got = client.query(
            f"""SELECT tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id, task_id,
                handoff_id, event, from_state, to_state, actor, attributes
            FROM {database}.handoff_transitions WHERE span_id IN {{s:Array(String)}}""",
            parameters={"s": sorted(set(spans))},
        )
        names = got.column_names
        # one ledger row per row of THIS insert, as serve writes them: the query also returns
        # rows of earlier inserts that share a span id (a resend, or other content)
        todo = Counter(_identity(r[6], r[2], r[0], r[5]) for r in rows)
        ledger_rows = []
        for r in got.result_rows:
            d = dict(zip(names, r, strict=True))
            key = _identity(d["tenant"], d["span_id"], d["time_ns"], d["attributes"])
            if todo[key] <= 0:
                continue
            todo[key] -= 1
            ledger_rows.append([d["tenant"], d["handoff_id"], d["span_id"], d["trace_id"],
                                row_hash(d), "seed", datetime.now(UTC)])  # fmt: skip
        client.insert(
            f"{database}.transition_ledger",
            ledger_rows,
            column_names=[
                "tenant",
                "handoff_id",
                "span_id",
                "trace_id",
                "row_hash",
                "ingest_batch",
                "ingested_at",
            ],
        )
    return spans
