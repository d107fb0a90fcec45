"""Evidence packages: everything an auditor needs about one handoff, and proof it is unaltered.

A package is a JSON-able dict (format "handoff-evidence/v1"). Its integrity section holds:
- `chain`: a hash chain over the transitions' row hashes (ingest.integrity.row_hash, the same
  function serve applies at ingest), in machine order: link_i = sha256(link_{i-1} || row_hash_i)
  starting from GENESIS ("0" * 64);
- `ledger`: how the stored rows compared with transition_ledger when the package was made;
- `package_sha256`: SHA-256 of the canonical JSON of the whole package with this one field
  removed.
`verify_package` recomputes all three and compares the package with the store as it is now.
"""

from __future__ import annotations

import copy
import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from analytics import reference as ref
from analytics._common import check_db, ns
from collector import semconv as sc
from collector.contract import TERMINAL
from ingest.integrity import GENESIS, HASHED_COLUMNS, canonical_json, chain, row_hash

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
_ROW_COLUMNS: Final = """tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id,
    parent_span_id, task_id, handoff_id, event, from_state, to_state, actor, valid, protocol,
    mode, from_agent, to_agent, topology, idempotency_key, payload_hash, deadline_ms,
    capabilities, evidence_refs, evidence_count, evidence_valid, error_code, fence_token,
    state_version, receipt_status, receipt_hash, span_name, service_name, attributes,
    claimed_tenant, ingest_batch"""
_RELATED_LIMIT: Final = 200


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """ok is True when nothing differs; problems name each differing row (span_id, column)."""

    ok: bool
    problems: list[str] = field(default_factory=list)


def iso_ns(t_ns: int) -> str:
    """ISO-8601 UTC with nanoseconds, e.g. 2026-11-23T10:00:00.000000001Z."""
    sec, frac = divmod(int(t_ns), 1_000_000_000)
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def package_sha256(package: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of `package` without integrity.package_sha256."""
    body = copy.deepcopy(dict(package))
    integ = dict(body.get("integrity") or {})
    integ.pop("package_sha256", None)
    body["integrity"] = integ
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


#: What the cross-handoff anomalies need from the task's other rows (no attribute maps).
_TASK_COLUMNS: Final = """tenant, toUnixTimestamp64Nano(time) AS time_ns, span_id, task_id,
    handoff_id, event, from_state, to_state, valid, mode, from_agent, to_agent, fence_token,
    state_version"""


def _rows(
    client: Client, db: str, where: str, params: dict[str, Any], columns: str = _ROW_COLUMNS
) -> list[dict[str, Any]]:
    res = client.query(
        f"SELECT {columns} FROM {db}.handoff_transitions WHERE {where}", parameters=params
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


def _fetch(client: Client, db: str, handoff_id: str, tenant: str | None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"h": handoff_id}
    where = "handoff_id = {h:String}"
    if tenant is not None:
        params["t"] = tenant
        where += " AND tenant = {t:String}"
    return _rows(client, db, where, params)


def _ledger(client: Client, db: str, tenant: str, handoff_id: str) -> dict[str, list[str]]:
    res = client.query(
        f"SELECT span_id, row_hash FROM {db}.transition_ledger "
        "WHERE tenant = {t:String} AND handoff_id = {h:String}",
        parameters={"t": tenant, "h": handoff_id},
    )
    out: dict[str, list[str]] = defaultdict(list)
    for span, h in res.result_rows:
        out[str(span)].append(h.decode() if isinstance(h, bytes) else str(h))
    return out


def _transition(r: Mapping[str, Any]) -> dict[str, Any]:
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
        "row_hash": row_hash(r),
    }


def build_package(
    rows: Sequence[Mapping[str, Any]],
    *,
    ledger: Mapping[str, Sequence[str]],
    as_of_ns: int,
    extra_anomalies: Sequence[str] = (),
    related_spans: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The package for one handoff's stored rows (pure). ValueError when rows is empty."""
    if not rows:
        raise ValueError("no transitions: cannot build an evidence package")
    ordered = ref.machine_order(rows)
    transitions = [_transition(r) for r in ordered]
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
    mismatched, missing = [], []
    for t in transitions:
        have = ledger.get(t["span_id"])
        if not have:
            missing.append(t["span_id"])
        elif t["row_hash"] not in have:
            mismatched.append(t["span_id"])
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
                "rows": len(transitions),
                "matched": len(transitions) - len(mismatched) - len(missing),
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
    rows = _fetch(client, db, handoff_id, tenant)
    if not rows:
        return None
    tenants = sorted({r["tenant"] for r in rows})
    if len(tenants) > 1:
        raise ValueError(f"handoff_id {handoff_id!r} exists in tenants {tenants}; pass tenant=")
    ten = tenants[0]
    now_ns = ns(as_of or datetime.now(UTC))
    # the task's rows (bloom filter on task_id) for the cross-handoff anomalies
    task_rows = _rows(
        client,
        db,
        "tenant = {t:String} AND task_id = {k:String}",
        {"t": ten, "k": rows[0]["task_id"]},
        _TASK_COLUMNS,
    )
    extra = _cross_anomalies(client, db, ten, rows, task_rows, handoff_id)
    return build_package(
        rows,
        ledger=_ledger(client, db, ten, handoff_id),
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


def _require(package: Any) -> None:
    if not isinstance(package, Mapping):
        raise ValueError("evidence package must be a JSON object")
    for key in ("handoff_id", "tenant", "transitions", "integrity"):
        if key not in package:
            raise ValueError(f"evidence package: missing field {key!r}")
    if not isinstance(package["transitions"], list):
        raise ValueError("evidence package: field 'transitions' must be a list")
    integ = package["integrity"]
    if not isinstance(integ, Mapping) or "package_sha256" not in integ or "chain" not in integ:
        raise ValueError("evidence package: integrity needs 'package_sha256' and 'chain'")
    for i, t in enumerate(package["transitions"]):
        missing = [
            c for c in ("span_id", "row_hash", *HASHED_COLUMNS) if c not in t and c != "time_ns"
        ]
        if not isinstance(t, Mapping) or missing or "time_ns" not in t:
            raise ValueError(f"evidence package: transitions[{i}] lacks {missing or ['time_ns']}")


def verify_offline(package: Mapping[str, Any]) -> list[str]:
    """Problems found from the package alone: its hash, each transition's row hash, the chain.

    Raises ValueError naming the field when the package is structurally malformed."""
    _require(package)
    problems = []
    if package_sha256(package) != package["integrity"]["package_sha256"]:
        problems.append("package: package_sha256 does not match its content (edited after export)")
    prev, links = GENESIS, package["integrity"]["chain"]
    for i, t in enumerate(package["transitions"]):
        if row_hash(t) != t["row_hash"]:
            problems.append(f"span_id={t['span_id']}: transition fields do not match its row_hash")
        prev = chain(prev, t["row_hash"])
        if i >= len(links) or links[i] != prev:
            problems.append(f"span_id={t['span_id']}: hash chain breaks at link {i}")
    if len(links) != len(package["transitions"]):
        problems.append(
            f"package: chain has {len(links)} links for {len(package['transitions'])} transitions"
        )
    return problems


def verify_package(
    client: Client, package: Mapping[str, Any], *, database: str | None = None
) -> VerifyResult:
    """Verify a package: offline checks (verify_offline), then against the store as it is now:
    every packaged row must still be stored with the same row hash (differing columns named),
    no row may have been added, and each stored row must match transition_ledger (where the
    package found a ledger entry at export). Raises ValueError for a malformed package."""
    db = check_db(database)
    problems = verify_offline(package)
    tenant, hid = str(package["tenant"]), str(package["handoff_id"])
    stored = _fetch(client, db, hid, tenant)
    by_span: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in stored:
        by_span[r["span_id"]].append(r)
    ledger = _ledger(client, db, tenant, hid)
    no_ledger_at_export = set(package["integrity"].get("ledger", {}).get("missing", []))
    packaged: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for t in package["transitions"]:
        packaged[t["span_id"]].append(t)
    for span, pts in packaged.items():
        now = by_span.get(span, [])
        if not now:
            problems.append(f"span_id={span}: in the package but no longer stored (deleted)")
            continue
        now_hashes = sorted(row_hash(r) for r in now)
        if sorted(t["row_hash"] for t in pts) != now_hashes:
            cols = _diff_columns(pts[0], now[0])
            what = f" (column {', '.join(cols)})" if cols else ""
            problems.append(f"span_id={span}: stored row differs from the package{what}")
    for span in sorted(set(by_span) - set(packaged)):
        problems.append(f"span_id={span}: stored but not in the package (added after export)")
    for span, now in sorted(by_span.items()):
        have = ledger.get(span)
        if not have:
            if span not in no_ledger_at_export and span in packaged:
                problems.append(
                    f"span_id={span}: ledger entry missing (deleted from transition_ledger)"
                )
            continue
        for r in now:
            if row_hash(r) not in have:
                cols = _diff_columns(packaged[span][0], r) if span in packaged else []
                what = f" (column {', '.join(cols)})" if cols else ""
                problems.append(
                    f"span_id={span}: stored row does not match the ingest ledger{what}"
                )
    return VerifyResult(ok=not problems, problems=problems)


def _diff_columns(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    for c in HASHED_COLUMNS:
        va, vb = a.get(c), b.get(c)
        if c == "attributes":
            va = {str(k): str(v) for k, v in dict(va or {}).items()}
            vb = {str(k): str(v) for k, v in dict(vb or {}).items()}
        elif c == "time_ns":
            va, vb = int(va or 0), int(vb or 0)
        if va != vb:
            out.append(c)
    return out
