"""Building an evidence package from proven rows (pure): shared by export and by verify,
which rebuilds the package from the rows it proves and compares every field.

A transition row is taken apart into what its row hash proves (foundation.integrity
HASHED_COLUMNS: ids, time, transition, actor, the attribute map) and what the view derives
from those (DERIVED_COLUMNS: evidence count and validity, receipt, error code, envelope
fields...). `proven_row` recomputes the derived columns from the attribute map, so a typed
column rewritten in the store after ingest never reaches a package: the package shows what
the hashed attributes say, and `typed_mismatches` names the stored columns that disagree.
Three columns are neither hashed nor derivable (parent_span_id, span_name, service_name,
from the span itself); the package carries them as the store's claim, checked against the
store when one is given.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from analytics.evidence._findings import Finding, findings_list, row_findings
from analytics.evidence._formats import CURRENT, V1, V3, cut_to
from analytics.evidence._why import Reason, handoff_reasons, reason_dicts
from analytics.oracle import funnel as ref
from analytics.oracle.audit import audit_anomalies
from collector import semconv as sc
from collector.contract import TERMINAL
from foundation.integrity import (
    DERIVED_COLUMNS,
    GENESIS,
    HASHED_COLUMNS,
    canonical_json,
    chain,
    derive_columns,
    derived_mismatches,
    row_hash,
)

FORMAT: Final = CURRENT
#: per-transition columns the package takes from the store as they are (no hash covers them)
CLAIMED_COLUMNS: Final = ("parent_span_id", "span_name", "service_name")
#: anomaly kinds that need the task's other handoffs (not rebuildable from one package), as
#: handoff-evidence/v2 had them; a v3 package names its own: the findings of source "store"
CROSS_KINDS: Final = frozenset({"idempotency_conflict", "stale_fence", "bounce"})
#: the reason of a kind from the store that no resolver explained (v3)
STORE_FALLBACK: Final = (
    "flagged by the anomaly passes over the store at export; this package cannot say why "
    "from its own rows"
)


def iso_ns(t_ns: int) -> str:
    """ISO-8601 UTC with nanoseconds, e.g. 2026-11-23T10:00:00.000000001Z."""
    sec, frac = divmod(int(t_ns), 1_000_000_000)
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def parse_iso_ns(text: str) -> int:
    """Inverse of iso_ns; ValueError for another shape."""
    if not (isinstance(text, str) and len(text) == 30 and text.endswith("Z") and text[19] == "."):
        raise ValueError(f"time {text!r} is not like 2026-11-23T10:00:00.000000001Z")
    sec = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return int(sec.timestamp()) * 1_000_000_000 + int(text[20:29])


def proven_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """The row as its hash proves it: HASHED_COLUMNS of `r`, DERIVED_COLUMNS recomputed from
    its attributes, CLAIMED_COLUMNS copied. KeyError when a hashed column is missing."""
    attrs = {str(k): str(v) for k, v in dict(r["attributes"]).items()}
    out: dict[str, Any] = {c: r[c] for c in HASHED_COLUMNS}
    out["time_ns"] = int(out["time_ns"])
    out["attributes"] = attrs
    out.update(derive_columns(attrs))
    for c in CLAIMED_COLUMNS:
        out[c] = str(r.get(c, "") or "")
    return out


def typed_mismatches(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """'span_id=S: column C stored X, its attributes say Y' for every stored typed column
    that disagrees with what the row's hashed attributes derive (an ALTER UPDATE)."""
    return [
        f"span_id={r['span_id']}: column {c} stored {have!r}, its hashed attributes say {want!r}"
        for r in rows
        for c, have, want in derived_mismatches(r)
    ]


def package_sha256(package: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of `package` without integrity.package_sha256 (a
    checksum of the file: anyone can recompute it; the proofs are the signed log's)."""
    body = copy.deepcopy(dict(package))
    integ = dict(body.get("integrity") or {})
    integ.pop("package_sha256", None)
    body["integrity"] = integ
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


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
        "span_name": r["span_name"],
        "service_name": r["service_name"],
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


def _ledger_section(
    transitions: Sequence[Mapping[str, Any]], n_rows: int, ledger: Mapping[str, Any]
) -> dict[str, Any]:
    mismatched, missing, matched = [], [], 0
    for t in transitions:
        have = ledger.get(t["span_id"])
        if not have:
            missing.append(t["span_id"])
        elif t["row_hash"] not in have:
            mismatched.append(t["span_id"])
        else:
            matched += t["arrivals"]
    return {
        "rows": n_rows,
        "matched": matched,
        "mismatched": mismatched,
        "missing": missing,
        "ok": not mismatched,
    }


def build_package(
    rows: Sequence[Mapping[str, Any]],
    *,
    ledger: Mapping[str, Sequence[str]],
    as_of_ns: int,
    extra_anomalies: Sequence[str] = (),
    related_spans: Sequence[Mapping[str, Any]] = (),
    log: Mapping[str, Any] | None = None,
    typed_mismatched: Sequence[str] = (),
    extra_reasons: Sequence[Reason | Mapping[str, Any]] = (),
    findings: Sequence[Finding | Mapping[str, Any]] = (),
    findings_query: Mapping[str, Any] | None = None,
    fmt: str = FORMAT,
) -> dict[str, Any]:
    """The package of one handoff's stored rows, copies included (pure). Every field comes
    from `proven_row` of the rows, so equal proven rows give an equal package, but what the
    store said of the handoff: `findings` (source "store", analytics.evidence._store_reads
    store_findings), asked as `findings_query` says, and `extra_anomalies` (kinds from
    elsewhere, v2's cross kinds: findings of source "store" in v3); the `anomaly_reasons` of
    those come from `extra_reasons` (analytics.evidence._why_task, _why_store). `fmt`: the format to
    build (analytics.evidence._formats; an earlier one to verify a package of it).
    ValueError when rows is empty or for an unknown format."""
    if not rows:
        raise ValueError("no transitions: cannot build an evidence package")
    proven = [proven_row(r) for r in rows]
    copies: dict[str, list[dict[str, Any]]] = {}  # row hash -> its stored rows
    for p in proven:
        copies.setdefault(row_hash(p), []).append(p)
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
    result = result_rows[-1]["attributes"] if result_rows else {}
    counted = [r for r in ordered if ref.counted(r)]
    last = counted[-1] if counted else None
    receipt_rows = [r for r in ordered if r["receipt_status"] or r["receipt_hash"]]
    receipt = receipt_rows[-1] if receipt_rows else None
    links, prev = [], GENESIS
    for t in transitions:
        prev = chain(prev, t["row_hash"])
        links.append(prev)
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
            "execution_id": result.get(sc.EXECUTION_ID, ""),
            "execution_version": result.get(sc.EXECUTION_VERSION, ""),
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
        "anomalies": [],
        "related_spans": [dict(s) for s in related_spans],
        "integrity": {
            "algorithm": "sha256",
            "row_hash_columns": list(HASHED_COLUMNS),
            "claimed_columns": list(CLAIMED_COLUMNS),
            "chain_genesis": GENESIS,
            "chain": links,
            "chain_head": links[-1],
            "ledger": _ledger_section(transitions, len(rows), ledger),
            # the stored typed columns the hashed attributes contradict (at export)
            "typed_columns": {
                "derived": list(DERIVED_COLUMNS),
                "mismatched": list(typed_mismatched),
            },
            "log": dict(log) if log is not None else {"head": None, "entries": [], "pending": []},
        },
    }
    own = set(ref.handoff_anomalies(ordered, as_of_ns=as_of_ns))
    if fmt != V1:
        # the protocol-audit kinds this handoff's own rows show (wrong consumer, grant
        # expired or exceeded, tenant mismatches); those needing other attempts or the
        # upstream handoff come from the store
        own |= set(audit_anomalies(ordered).get((head["tenant"], head["handoff_id"]), ()))
    store = (
        _store_findings(findings, extra_anomalies, extra_reasons, own, head["handoff_id"])
        if fmt == V3
        else []
    )
    pkg["anomalies"] = sorted(own | set(extra_anomalies) | {str(f["kind"]) for f in store})
    if fmt == V3:
        pkg["findings"] = findings_list([*row_findings(sorted(own)), *store])
        pkg["findings_query"] = dict(findings_query) if findings_query is not None else None
    # why each kind fired: a field of a transition, or another handoff (analytics.evidence._why)
    pkg["anomaly_reasons"] = reason_dicts(
        pkg["anomalies"],
        [*handoff_reasons(pkg["anomalies"], ordered, as_of_ns=as_of_ns), *extra_reasons],
        fallback=STORE_FALLBACK if fmt == V3 else None,
    )
    if fmt != V3:
        pkg = cut_to(pkg, fmt)
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    return pkg


def _store_findings(
    findings: Sequence[Finding | Mapping[str, Any]],
    extra: Sequence[str],
    reasons: Sequence[Reason | Mapping[str, Any]],
    own: set[str],
    handoff_id: str,
) -> list[dict[str, Any]]:
    """The store's findings as package objects: `findings`, then a finding per kind of
    `extra` not among them, naming the other handoff its reason names (not the handoff
    itself); a kind the rows show themselves is the rows' finding."""
    other: dict[str, str] = {}
    for r in reasons:
        d = r.as_dict() if isinstance(r, Reason) else dict(r)
        named = str(d.get("other_handoff_id") or "")
        other.setdefault(str(d.get("kind")), "" if named == handoff_id else named)
    given = findings_list(findings)
    have = {f["kind"] for f in given}
    given += [
        Finding(k, "store", handoffs=(other[k],) if other.get(k) else ()).as_dict()
        for k in sorted(set(extra) - have)
    ]
    return [f for f in given if f["kind"] not in own]


def rows_of(package: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stored rows a package stands for, each transition repeated `arrivals` times, with
    only what the row hash proves (and the claimed columns). ValueError naming the field
    when a transition lacks one."""
    out: list[dict[str, Any]] = []
    for i, t in enumerate(package["transitions"]):
        if not isinstance(t, Mapping):
            raise ValueError(f"evidence package: transitions[{i}] is not an object")
        missing = [c for c in HASHED_COLUMNS if c not in t]
        if missing:
            raise ValueError(f"evidence package: transitions[{i}] lacks {missing}")
        if not isinstance(t["attributes"], Mapping):
            raise ValueError(f"evidence package: transitions[{i}].attributes is not an object")
        n = t.get("arrivals", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"evidence package: transitions[{i}].arrivals must be an int >= 1")
        try:
            row = proven_row(t)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"evidence package: transitions[{i}]: {exc}") from None
        out.extend(dict(row) for _ in range(n))
    return out


def diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, a's value, b's value) for every leaf where a and b differ, e.g.
    ('transitions[3].evidence_count', 0, 2); a key only one side has is a difference."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append((p, "(absent)", b[k]))
            elif k not in b:
                out.append((p, a[k], "(absent)"))
            else:
                out += diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for i in range(max(len(a), len(b))):
            p = f"{path}[{i}]"
            if i >= len(a):
                out.append((p, "(absent)", b[i]))
            elif i >= len(b):
                out.append((p, a[i], "(absent)"))
            else:
                out += diff(a[i], b[i], p)
        return out
    if type(a) is not type(b) or a != b:
        return [(path, a, b)]
    return []
