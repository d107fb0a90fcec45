"""What an evidence package reads from the store besides the handoff's own rows: the task's
other rows, what the anomaly passes say of the handoff (its findings, with the other handoffs
and fleet groups they involve) and the related spans of its traces. Shared by export
(analytics.evidence.package) and verify (analytics.evidence.verify)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.rows import (
    POINT_LOOKUP,
    TASK_COLUMNS,
    TASK_KEYS,
    fetch_ledger_entries,
    fetch_rows,
)
from analytics.evidence._assemble import iso_ns, parse_iso_ns
from analytics.evidence._findings import (
    Finding,
    row_kinds,
    scope_of,
    store_kinds,
    subject_window,
)
from analytics.evidence._why import Reason
from analytics.oracle import funnel as ref
from foundation.integrity import derive_columns

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "StoreFindings",
    "cross_anomalies",
    "fetch_task_rows",
    "findings_query",
    "ledger_batches",
    "related",
    "store_findings",
]

_RELATED_LIMIT: Final = 200
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def fetch_task_rows(
    client: Client, db: str, tenant: str, task_id: str, own: Sequence[Mapping[str, Any]] = ()
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
    client: Client,
    db: str,
    tenant: str,
    rows: Sequence[Mapping[str, Any]],
    task_rows: Sequence[Mapping[str, Any]],
    handoff_id: str,
) -> list[str]:
    """idempotency_conflict, stale_fence, bounce: the kinds that need the task's other rows,
    as a handoff-evidence/v2 package computed them (its verification against a store)."""
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


def related(
    client: Client, db: str, traces: list[str], rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
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


@dataclass(frozen=True, slots=True)
class StoreFindings:
    """What the anomaly passes say of one handoff: its `findings` (source "store", in the
    order asked), their `reasons`, the `query` section the package records (the window and
    the kinds asked), and `unknown`: kinds of a recorded query this version's passes lack."""

    findings: list[Finding]
    reasons: list[Reason]
    query: dict[str, Any]
    unknown: list[str] = field(default_factory=list)


def _dt(t_ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(t_ns) // 1000)


def findings_query(
    rows: Sequence[Mapping[str, Any]], task_rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The package's `findings_query` for a handoff (pure): the created-time window the
    passes are asked over (subject_window) and every kind asked (all but the row kinds)."""
    lo, hi = subject_window(rows, task_rows)
    return {
        "window_start": iso_ns(lo),
        "window_end": iso_ns(hi),
        "kinds": list(store_kinds(row_kinds())),
    }


def _parsed(query: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """(start ns, end ns, kinds) of a package's findings_query; ValueError naming the field."""
    if not isinstance(query, Mapping):
        raise ValueError("evidence package: findings_query must be an object")
    try:
        lo, hi = (parse_iso_ns(query[k]) for k in ("window_start", "window_end"))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"evidence package: findings_query window: {exc}") from None
    kinds = query.get("kinds")
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ValueError("evidence package: findings_query.kinds must be a list of kinds")
    if hi <= lo:
        raise ValueError("evidence package: findings_query.window_end must be after its start")
    return lo, hi, kinds


def store_findings(
    client: Client,
    db: str,
    rows: Sequence[Mapping[str, Any]],
    task_rows: Sequence[Mapping[str, Any]],
    *,
    as_of_ns: int,
    query: Mapping[str, Any] | None = None,
) -> StoreFindings:
    """The kinds of the store that flag the handoff of `rows` (analytics.evidence._evaluate:
    fast evaluators, else the anomaly passes kept to the handoff, over `query`'s window with
    the clock at `as_of_ns`), each resolved into the other handoffs or fleet groups it
    involves (analytics.evidence._why_store). `query`: a package's recorded findings_query (verify),
    else the one findings_query builds. ValueError for a malformed query."""
    from analytics._sql.anomalies import KIND_PASS
    from analytics._sql.cohort import Window
    from analytics.evidence._evaluate import Neighbourhood, evaluate, partners
    from analytics.evidence._why_store import RESOLVERS, default_fleet

    q = dict(query) if query is not None else findings_query(rows, task_rows)
    lo, hi, kinds = _parsed(q)
    asked = [k for k in kinds if k in KIND_PASS]
    # read against the store's settle state only once a pass runs (Neighbourhood.settled)
    window = Window(start=_dt(lo), end=_dt(hi), as_of=_dt(as_of_ns))
    tenant, hid = str(rows[0]["tenant"]), str(rows[0]["handoff_id"])
    n = Neighbourhood(client, db, tenant, hid, rows, task_rows, window)
    flagged = evaluate(n, asked)
    findings, reasons = [], []
    for kind in (k for k in asked if k in flagged):
        resolve = RESOLVERS.get(kind) or (default_fleet if scope_of(kind) == "fleet" else None)
        got = resolve(n) if resolve is not None else None
        # the resolver's, and those a pairwise oracle pairs it with (any relation it reads)
        others = (*(got.handoffs if got else ()), *partners(n, kind))
        findings.append(Finding(kind, "store", handoffs=others, fleet=got.fleet if got else ()))
        if got is not None and got.reason is not None:
            reasons.append(got.reason)
    return StoreFindings(findings, reasons, q, [k for k in kinds if k not in KIND_PASS])
