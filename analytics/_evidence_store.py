"""What an evidence package reads from the store besides the handoff's own rows: the task's
other rows (cross-handoff anomalies) and the related spans of its traces. Shared by export
(analytics.evidence) and verify (analytics.verify)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from analytics import reference as ref
from analytics._package import iso_ns
from analytics._rows import POINT_LOOKUP, TASK_COLUMNS, TASK_KEYS, fetch_ledger_entries, fetch_rows
from foundation.integrity import derive_columns

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["cross_anomalies", "fetch_task_rows", "ledger_batches", "related"]

_RELATED_LIMIT: Final = 200


def fetch_task_rows(
    client: Client, db: str, tenant: str, task_id: str, own: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The task's rows for the cross-handoff anomalies: the task's handoff ids from the
    handoff_tasks index (sql/005), then their rows by primary key (tenant, handoff_id), with
    the typed columns the anomalies read recomputed from the hashed attributes. `own`: rows
    already read of some of its handoffs (all their columns, fetch_handoff), taken as they
    are instead of read again."""
    mine = sorted({r["handoff_id"] for r in own})
    rows = fetch_rows(
        client,
        db,
        f"""tenant = {{t:String}} AND task_id = {{k:String}} AND handoff_id IN (
            SELECT handoff_id FROM {db}.handoff_tasks
            WHERE tenant = {{t:String}} AND task_id = {{k:String}})
            AND handoff_id NOT IN {{own:Array(String)}}""",
        {"t": tenant, "k": task_id, "own": mine},
        TASK_COLUMNS + ", attributes, capabilities, evidence_refs",
    )
    keep = (*TASK_KEYS, "attributes", "capabilities", "evidence_refs")
    rows += [
        {k: r[k] for k in keep} for r in own if r["tenant"] == tenant and r["task_id"] == task_id
    ]
    for r in rows:
        r.update({k: v for k, v in derive_columns(r.pop("attributes")).items() if k in r})
    return rows


def ledger_batches(client: Client, db: str, tenant: str, handoff_id: str) -> dict[str, list[str]]:
    """row hash -> the ingest batches of the handoff's ledger rows with that hash (a span
    stored again has one per arrival), by primary key (tenant, handoff_id)."""
    return fetch_ledger_entries(client, db, tenant, handoff_id).batches


def cross_anomalies(
    client: Client, db: str, tenant: str, rows, task_rows, handoff_id: str
) -> list[str]:
    """idempotency_conflict, stale_fence, bounce: the kinds that need the task's other rows."""
    kinds: set[str] = set()
    kinds.update(ref.task_anomalies(task_rows, handoff_id))
    keys = sorted(
        {r["idempotency_key"] for r in rows if r["event"] == "create" and r["idempotency_key"]}
    )
    if keys:
        n = client.query(
            f"""SELECT uniqExact(payload_hash) FROM {db}.handoff_transitions
            WHERE tenant = {{t:String}} AND event = 'create'
              AND idempotency_key IN {{k:Array(String)}} AND payload_hash != ''""",
            parameters={"t": tenant, "k": keys},
            settings=POINT_LOOKUP,
        ).result_rows[0][0]
        if n > 1:
            kinds.add("idempotency_conflict")
    return sorted(kinds)


def related(client: Client, db: str, traces: list[str], rows) -> list[dict[str, Any]]:
    """Other spans of the handoff's traces (not transitions of this handoff), at most 200,
    each with the handoff it is a transition of (`handoff_id`, "" for a span of none)."""
    if not traces:
        return []
    own = sorted({r["span_id"] for r in rows})
    res = client.query(
        f"""SELECT TraceId, SpanId, ParentSpanId, SpanName, ServiceName,
            toUnixTimestamp64Nano(Timestamp) AS t, SpanAttributes['handoff.handoff_id']
        FROM {db}.otel_traces
        WHERE TraceId IN {{tr:Array(String)}} AND SpanId NOT IN {{own:Array(String)}}
        ORDER BY t, SpanId LIMIT {_RELATED_LIMIT}""",
        parameters={"tr": traces, "own": own},
        settings=POINT_LOOKUP,
    )
    return [
        {
            "trace_id": a,
            "span_id": b,
            "parent_span_id": c,
            "name": d,
            "service": e,
            "time": iso_ns(t),
            "handoff_id": h,
        }
        for a, b, c, d, e, t, h in res.result_rows
    ]
