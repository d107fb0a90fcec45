"""Evidence packages: everything an auditor needs about one handoff, and proof it is unaltered.

A package is a JSON-able dict (format "handoff-evidence/v1"). `transitions` lists each
distinct stored row once (rows with equal row hashes are one span stored again: an
exporter's retry, a collector re-sending a batch), with `arrivals`, how many times it is
stored; a span id stored with differing content is listed once per content. Its integrity
section holds:
- `chain`: a hash chain over the transitions' row hashes (foundation.integrity.row_hash, the same
  function serve applies at ingest), in machine order: link_i = sha256(link_{i-1} || row_hash_i)
  starting from GENESIS ("0" * 64);
- `ledger`: how every stored row (each arrival) compared with transition_ledger when the
  package was made: `rows` stored rows, `matched` of them found there, the span ids of the
  others (`mismatched`: no entry with that hash; `missing`: no entry for the span);
- `package_sha256`: SHA-256 of the canonical JSON of the whole package with this one field
  removed.
`verify_package` recomputes all three and compares the package with the store as it is now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from analytics import reference as ref
from analytics._common import check_db, ns
from analytics._rows import POINT_LOOKUP, TASK_COLUMNS, fetch_handoff, fetch_ledger, fetch_rows
from analytics.verify import VerifyResult, package_sha256, verify_offline, verify_package
from collector import semconv as sc
from collector.contract import TERMINAL
from foundation.integrity import GENESIS, HASHED_COLUMNS, chain, row_hash

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "FORMAT",
    "VerifyResult",
    "build_package",
    "evidence_package",
    "package_sha256",
    "verify_offline",
    "verify_package",
]

FORMAT: Final = "handoff-evidence/v1"
_RELATED_LIMIT: Final = 200


def iso_ns(t_ns: int) -> str:
    """ISO-8601 UTC with nanoseconds, e.g. 2026-11-23T10:00:00.000000001Z."""
    sec, frac = divmod(int(t_ns), 1_000_000_000)
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def _transition(r: Mapping[str, Any], h: str, arrivals: int) -> dict[str, Any]:
    return {
        "event": r["event"],
        "from_state": r["from_state"],
        "to_state": r["to_state"],
        "actor": r["actor"],
        "time": iso_ns(r["time_ns"]),
        "time_ns": r["time_ns"],
        "tenant": r["tenant"],
        "task_id": r["task_id"],
        "handoff_id": r["handoff_id"],
        "span_id": r["span_id"],
        "trace_id": r["trace_id"],
        "parent_span_id": r["parent_span_id"],
        "valid": r["valid"],
        "counted": ref.counted(r),
        "evidence_count": r["evidence_count"],
        "evidence_valid": r["evidence_valid"],
        "error_code": r["error_code"],
        "receipt_status": r["receipt_status"],
        "receipt_hash": r["receipt_hash"],
        "attributes": dict(sorted(r["attributes"].items())),
        "row_hash": h,
        "arrivals": arrivals,
    }


def build_package(
    rows: Sequence[Mapping[str, Any]],
    *,
    ledger: Mapping[str, Sequence[str]],
    as_of_ns: int,
    extra_anomalies: Sequence[str] = (),
    related_spans: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The package for one handoff's stored rows, copies included (pure). ValueError when
    rows is empty."""
    if not rows:
        raise ValueError("no transitions: cannot build an evidence package")
    copies: dict[str, list[Mapping[str, Any]]] = {}  # row hash -> its stored rows
    for r in rows:
        copies.setdefault(row_hash(r), []).append(r)
    # the first row of each hash stands for its copies: (hash, arrivals) by that row's id
    stands_for = {id(c[0]): (h, len(c)) for h, c in copies.items()}
    ordered = ref.machine_order(c[0] for c in copies.values())
    transitions = [_transition(r, *stands_for[id(r)]) for r in ordered]
    creates = [r for r in ordered if r["event"] == "create"]
    head = creates[0] if creates else ordered[0]
    attrs = head["attributes"] if creates else {}
    envelope = {
        name.removeprefix("handoff."): attrs[name]
        for name in sorted(attrs)
        if name.startswith("handoff.")
        and name not in (sc.EVENT, sc.FROM_STATE, sc.TO_STATE, sc.ACTOR, sc.TENANT, sc.VALID)
    }
    refs: list[str] = []
    for r in ordered:
        for e in r["evidence_refs"]:
            if e not in refs:
                refs.append(e)
    result_rows = [r for r in ordered if r["attributes"].get(sc.EXECUTION_ID)]
    counted = [r for r in ordered if ref.counted(r)]
    last = counted[-1] if counted else None
    receipt_rows = [r for r in ordered if r["receipt_status"] or r["receipt_hash"]]
    receipt = receipt_rows[-1] if receipt_rows else None
    links, prev = [], GENESIS
    for t in transitions:
        prev = chain(prev, t["row_hash"])
        links.append(prev)
    # every arrival is checked (equal rows have equal hashes, so one lookup per transition)
    mismatched, missing, matched = [], [], 0
    for t in transitions:
        have = ledger.get(t["span_id"])
        if not have:
            missing.append(t["span_id"])
        elif t["row_hash"] not in have:
            mismatched.append(t["span_id"])
        else:
            matched += t["arrivals"]
    pkg: dict[str, Any] = {
        "format": FORMAT,
        "handoff_id": head["handoff_id"],
        "task_id": head["task_id"],
        "tenant": head["tenant"],
        "generated_at": iso_ns(as_of_ns),
        "envelope": envelope,
        "input_summary": {
            "objective_summary": attrs.get(sc.OBJECTIVE_SUMMARY, ""),
            "objective_hash": attrs.get(sc.OBJECTIVE_HASH, ""),
            "constraints": attrs.get(sc.CONSTRAINTS, ""),
            "reply_contract": attrs.get(sc.REPLY_CONTRACT, ""),
        },
        "evidence_refs": refs,
        "execution": {
            "execution_id": result_rows[-1]["attributes"].get(sc.EXECUTION_ID, "")
            if result_rows
            else "",
            "execution_version": result_rows[-1]["attributes"].get(sc.EXECUTION_VERSION, "")
            if result_rows
            else "",
            "actors": sorted({r["actor"] for r in ordered}),
            "services": sorted({r["service_name"] for r in ordered}),
        },
        "transitions": transitions,
        "terminal": {
            "state": last["to_state"] if last else "",
            "is_terminal": bool(last and last["to_state"] in TERMINAL),
            "receipt": {
                "status": receipt["receipt_status"] if receipt else "",
                "hash": receipt["receipt_hash"] if receipt else "",
                "result_version": receipt["attributes"].get(sc.RESULT_VERSION, "")
                if receipt
                else "",
            },
        },
        "anomalies": sorted(
            set(ref.handoff_anomalies(ordered, as_of_ns=as_of_ns)) | set(extra_anomalies)
        ),
        "related_spans": [dict(s) for s in related_spans],
        "integrity": {
            "algorithm": "sha256",
            "row_hash_columns": list(HASHED_COLUMNS),
            "chain_genesis": GENESIS,
            "chain": links,
            "chain_head": links[-1],
            "ledger": {
                "rows": len(rows),
                "matched": matched,
                "mismatched": mismatched,
                "missing": missing,
                "ok": not mismatched,
            },
        },
    }
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    return pkg


def evidence_package(
    client: Client,
    *,
    database: str | None = None,
    handoff_id: str,
    tenant: str | None = None,
    as_of: datetime | None = None,
) -> dict[str, Any] | None:
    """The evidence package of `handoff_id` (dict, see module doc), or None when unknown.

    Raises ValueError for an empty id, or when the id exists under several tenants and
    `tenant` is not given. `as_of` (default now) stamps generated_at and the SLA clocks.
    """
    db = check_db(database)
    if not handoff_id:
        raise ValueError("handoff_id must be a non-empty string")
    rows = fetch_handoff(client, db, handoff_id, tenant)
    if not rows:
        return None
    tenants = sorted({r["tenant"] for r in rows})
    if len(tenants) > 1:
        raise ValueError(f"handoff_id {handoff_id!r} exists in tenants {tenants}; pass tenant=")
    ten = tenants[0]
    now_ns = ns(as_of or datetime.now(UTC))
    # the task's rows for the cross-handoff anomalies: the task's handoff ids from the
    # handoff_tasks index (sql/005), then their rows by primary key (tenant, handoff_id)
    task_rows = fetch_rows(
        client,
        db,
        f"""tenant = {{t:String}} AND task_id = {{k:String}} AND handoff_id IN (
            SELECT handoff_id FROM {db}.handoff_tasks
            WHERE tenant = {{t:String}} AND task_id = {{k:String}})""",
        {"t": ten, "k": rows[0]["task_id"]},
        TASK_COLUMNS,
    )
    extra = _cross_anomalies(client, db, ten, rows, task_rows, handoff_id)
    return build_package(
        rows,
        ledger=fetch_ledger(client, db, ten, handoff_id),
        as_of_ns=now_ns,
        extra_anomalies=extra,
        related_spans=_related(client, db, sorted({r["trace_id"] for r in rows}), rows),
    )


def _cross_anomalies(
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


def _related(client: Client, db: str, traces: list[str], rows) -> list[dict[str, Any]]:
    """Other spans of the handoff's traces (not transitions of this handoff), at most 200."""
    if not traces:
        return []
    own = sorted({r["span_id"] for r in rows})
    res = client.query(
        f"""SELECT TraceId, SpanId, ParentSpanId, SpanName, ServiceName,
            toUnixTimestamp64Nano(Timestamp) AS t
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
        }
        for a, b, c, d, e, t in res.result_rows
    ]
