"""Evidence packages: everything an auditor needs about one handoff, and proof it is unaltered.

A package is a JSON-able dict (format "handoff-evidence/v3", built by analytics.evidence._assemble;
earlier formats still verify: analytics.evidence._formats).
`transitions` lists each distinct stored row once (rows with equal row hashes are one span
stored again: an exporter's retry, a collector re-sending a batch), with `arrivals`, how
many times it is stored. Every other field is derived from those rows' hashed columns, so
verify rebuilds the whole package from the rows it proves and names each field that
differs, but for what the store says of the handoff: `findings` lists every anomaly kind
that flags it (analytics.evidence._findings), those of source "store" asked of the anomaly
passes as `findings_query` records, with the other handoffs or fleet groups involved;
verify re-derives them against a store only. Its integrity section holds:
- `chain`: a hash chain over the row hashes (foundation.integrity.row_hash, the function
  serve applies at ingest) in machine order, link_i = sha256(link_{i-1} || row_hash_i);
- `ledger`: how every stored row compared with transition_ledger at export: `matched`,
  `mismatched` (no entry with that hash), `missing` (no entry for the span);
- `typed_columns`: the stored typed columns (evidence_valid, receipt_hash, ...) that the
  row's hashed attributes contradict at export (an ALTER UPDATE after ingest);
- `log`: the signed ledger log (analytics.evidence._log_proofs): the newest signed head and an
  RFC 9162 inclusion proof per transition, so the package verifies offline with the
  public key. The proofs are assembled from the pieces of the log the signer stores
  (sql/008: O(log n) rows read); when those do not reach the newest head, or do not match
  the ledger rows they cover, from a full read of the log, and `log.note` says why. With
  several serve instances on one store each has its own log, and each entry names the
  instance whose log proves it (analytics.evidence._store_logs);
- `package_sha256`: a checksum of the rest (anyone can recompute it; it proves nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.cohort import check_db, ns
from analytics._sql.rows import fetch_handoff, fetch_ledger_entries
from analytics.evidence._assemble import FORMAT, build_package, iso_ns, typed_mismatches
from analytics.evidence._store_logs import StoreLogs
from analytics.evidence._store_reads import fetch_task_rows, related, store_findings
from analytics.evidence.verify import (
    VerifyResult,
    offline_notes,
    package_sha256,
    verify_offline,
    verify_package,
)
from analytics.oracle import funnel as ref
from foundation.keys import PublicKeys
from foundation.store import query_each

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "FORMAT",
    "VerifyResult",
    "build_package",
    "evidence_package",
    "iso_ns",
    "package_sha256",
    "task_bundle",
    "verify_offline",
    "verify_package",
    "verify_task_bundle",
]

_RELATED_LIMIT: Final = 200


TASK_FORMAT: Final = "handoff-task-evidence/v1"


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
    `tenant` is not given. `as_of` (default now) stamps generated_at and the SLA clocks; it
    is moved up to the signing time of the newest head when that is later.
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
    return _package(client, db, rows, ns(as_of or datetime.now(UTC)), StoreLogs(client, db))


def _package(
    client: Client, db: str, rows: Sequence[Mapping[str, Any]], now_ns: int, logs: StoreLogs
) -> dict[str, Any]:
    ten, hid = rows[0]["tenant"], rows[0]["handoff_id"]
    if logs.heads:  # never before its heads were signed (serve's clock may run ahead)
        now_ns = max(now_ns, *(h.signed_at for h in logs.heads.values()))
    traces = sorted({r["trace_id"] for r in rows})
    # three independent reads, two at a time (foundation.store.query_each), the dearest first
    task_rows, ledger, related_spans = query_each(
        client,
        [
            lambda c: fetch_task_rows(c, db, ten, rows[0]["task_id"], rows),
            lambda c: fetch_ledger_entries(c, db, ten, hid),
            lambda c: related(c, db, traces, rows),
        ],
    )
    found = store_findings(client, db, rows, task_rows, as_of_ns=now_ns)
    pkg = build_package(
        rows,
        ledger=ledger.by_span,
        as_of_ns=now_ns,
        related_spans=related_spans,
        typed_mismatched=typed_mismatches(rows),
        extra_reasons=found.reasons,
        findings=found.findings,
        findings_query=found.query,
    )
    # the proofs, in the package's transition order (one per distinct row)
    pkg["integrity"]["log"] = logs.section(pkg["transitions"], ledger.batches)
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    return pkg


def _created_ns(pkg: dict[str, Any]) -> tuple[int, str]:
    creates = [t["time_ns"] for t in pkg["transitions"] if t["event"] == "create"]
    return (min(creates) if creates else pkg["transitions"][0]["time_ns"], pkg["handoff_id"])


def task_bundle(
    client: Client,
    *,
    database: str | None = None,
    task_id: str,
    tenant: str | None = None,
    as_of: datetime | None = None,
) -> dict[str, Any] | None:
    """Every handoff of `task_id` as one document (format handoff-task-evidence/v1): its
    packages in causation order (created time, then handoff id), each with its own proofs
    against one signed head. None when the task is unknown; ValueError as evidence_package."""
    db = check_db(database)
    if not task_id:
        raise ValueError("task_id must be a non-empty string")
    params: dict[str, Any] = {"k": task_id}
    where = "task_id = {k:String}"
    if tenant is not None:
        params["t"] = tenant
        where += " AND tenant = {t:String}"
    found = client.query(
        f"SELECT DISTINCT tenant, handoff_id FROM {db}.handoff_transitions WHERE {where}",
        parameters=params,
    ).result_rows
    if not found:
        return None
    tenants = sorted({str(t) for t, _h in found})
    if len(tenants) > 1:
        raise ValueError(f"task_id {task_id!r} exists in tenants {tenants}; pass tenant=")
    now_ns = ns(as_of or datetime.now(UTC))
    logs = StoreLogs(client, db)
    packages = [
        _package(client, db, fetch_handoff(client, db, str(h), tenants[0]), now_ns, logs)
        for h in sorted({str(h) for _t, h in found})
    ]
    packages.sort(key=_created_ns)
    bundle: dict[str, Any] = {
        "format": TASK_FORMAT,
        "task_id": task_id,
        "tenant": tenants[0],
        "generated_at": iso_ns(now_ns),
        "handoffs": [p["handoff_id"] for p in packages],
        "packages": packages,
    }
    return bundle


def verify_task_bundle(
    client: Client | None,
    bundle: dict[str, Any],
    *,
    database: str | None = None,
    keys: PublicKeys | None = None,
) -> VerifyResult:
    """Verify each package of a task bundle (offline when `client` is None, else against
    the store too), their order, and that together they are the task's handoffs. The
    task-level anomalies stale_fence and bounce are rebuilt from all packages' rows."""
    from analytics.evidence._assemble import rows_of

    if not isinstance(bundle.get("packages"), list) or not bundle["packages"]:
        raise ValueError("task bundle: field 'packages' must be a non-empty list")
    problems: list[str] = []
    notes: list[str] = []
    all_rows = [r for p in bundle["packages"] for r in rows_of(p)]
    for i, pkg in enumerate(bundle["packages"]):
        where = f"packages[{i}] ({pkg.get('handoff_id')})"
        if pkg.get("task_id") != bundle.get("task_id") or pkg.get("tenant") != bundle.get("tenant"):
            problems.append(f"{where}: not of task {bundle.get('task_id')!r}")
        local = set(ref.task_anomalies(all_rows, pkg["handoff_id"]))
        claimed = set(pkg.get("anomalies") or []) & {"stale_fence", "bounce"}
        if local != claimed:
            problems.append(f"{where}.anomalies: package {sorted(claimed)}, rebuilt from the "
                            f"task's rows {sorted(local)} (stale_fence, bounce)")  # fmt: skip
        if client is None:
            found = verify_offline(pkg, keys=keys, require_log=True)
        else:
            res = verify_package(client, pkg, database=database, keys=keys)
            found, notes = res.problems, res.notes
        problems += [f"{where}: {p}" for p in found]
    order = [_created_ns(p) for p in bundle["packages"]]
    if order != sorted(order):
        problems.append("packages: not in created-time order")
    if bundle.get("handoffs") != [p.get("handoff_id") for p in bundle["packages"]]:
        problems.append("handoffs: does not list the packages' handoff ids in order")
    if client is not None:
        db = check_db(database)
        now = client.query(
            f"SELECT DISTINCT handoff_id FROM {db}.handoff_transitions "
            "WHERE tenant = {t:String} AND task_id = {k:String}",
            parameters={"t": bundle.get("tenant", ""), "k": bundle.get("task_id", "")},
        ).result_rows
        missing = sorted({str(h) for (h,) in now} - set(bundle.get("handoffs") or []))
        if missing:
            problems.append(
                f"handoffs: the store has handoffs of the task not in the bundle: {missing}"
            )
    else:
        notes = ["offline: whether the task has other handoffs is not checked without the store"]
        notes += offline_notes(*bundle["packages"])
    return VerifyResult(ok=not problems, problems=problems, notes=notes)
