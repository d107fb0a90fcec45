"""Reading handoff_transitions and transition_ledger rows for evidence packages."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

#: Point lookups read a granule or two: one thread costs less CPU and wall time than many.
POINT_LOOKUP: Final = {"max_threads": 1}
#: Every column of a transition a package holds (time as integer ns).
ROW_COLUMNS: Final = """tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id,
    parent_span_id, task_id, handoff_id, event, from_state, to_state, actor, valid, protocol,
    mode, from_agent, to_agent, topology, idempotency_key, payload_hash, deadline_ms,
    capabilities, evidence_refs, evidence_count, evidence_valid, error_code, fence_token,
    state_version, receipt_status, receipt_hash, span_name, service_name, attributes,
    claimed_tenant, ingest_batch"""
#: What the cross-handoff anomalies need from the task's other rows (no attribute maps).
TASK_COLUMNS: Final = """tenant, toUnixTimestamp64Nano(time) AS time_ns, span_id, task_id,
    handoff_id, event, from_state, to_state, valid, mode, from_agent, to_agent, fence_token,
    state_version"""
#: the keys of a row read with TASK_COLUMNS
TASK_KEYS: Final = tuple(c.split(" AS ")[-1].strip() for c in TASK_COLUMNS.split(","))


def fetch_rows(
    client: Client, db: str, where: str, params: dict[str, Any], columns: str = ROW_COLUMNS
) -> list[dict[str, Any]]:
    """handoff_transitions rows matching `where` (bound `params`) as dicts; attributes as a
    str->str dict, time_ns as int (the shape foundation.integrity.row_hash expects)."""
    res = client.query(
        f"SELECT {columns} FROM {db}.handoff_transitions WHERE {where}",
        parameters=params,
        settings=POINT_LOOKUP,
    )
    out = []
    for r in res.result_rows:
        d = dict(zip(res.column_names, r, strict=True))
        if "attributes" in d:
            d["attributes"] = {str(k): str(v) for k, v in dict(d["attributes"]).items()}
            d["capabilities"] = [str(x) for x in d["capabilities"]]
            d["evidence_refs"] = [str(x) for x in d["evidence_refs"]]
        d["time_ns"] = int(d["time_ns"])
        d["valid"] = bool(d["valid"])
        out.append(d)
    return out


def fetch_handoff(
    client: Client, db: str, handoff_id: str, tenant: str | None
) -> list[dict[str, Any]]:
    """Every stored row of one handoff (all tenants when `tenant` is None)."""
    params: dict[str, Any] = {"h": handoff_id}
    where = "handoff_id = {h:String}"
    if tenant is not None:
        params["t"] = tenant
        where += " AND tenant = {t:String}"
    return fetch_rows(client, db, where, params)


@dataclass(frozen=True, slots=True)
class LedgerEntries:
    """One handoff's ledger entries: span_id -> row hashes (`by_span`), and row hash -> the
    ingest batches of the entries with that hash (`batches`: a span stored again has one
    per arrival)."""

    by_span: dict[str, list[str]]
    batches: dict[str, list[str]]


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def fetch_ledger_entries(client: Client, db: str, tenant: str, handoff_id: str) -> LedgerEntries:
    """The handoff's transition_ledger entries, in one read by primary key."""
    res = client.query(
        f"SELECT span_id, toString(row_hash), ingest_batch FROM {db}.transition_ledger "
        "WHERE tenant = {t:String} AND handoff_id = {h:String}",
        parameters={"t": tenant, "h": handoff_id},
        settings=POINT_LOOKUP,
    )
    by_span: dict[str, list[str]] = defaultdict(list)
    batches: dict[str, list[str]] = {}
    for span, h, b in res.result_rows:
        by_span[_s(span)].append(_s(h))
        batches.setdefault(_s(h), []).append(_s(b))
    return LedgerEntries(by_span, batches)


def fetch_ledger(client: Client, db: str, tenant: str, handoff_id: str) -> dict[str, list[str]]:
    """span_id -> ledger row hashes of one handoff."""
    return fetch_ledger_entries(client, db, tenant, handoff_id).by_span
