"""Verifying evidence packages by rebuilding them: from their own rows (offline) and from the
store as it is now.

Offline (`verify_offline`): the package is rebuilt from the hashed columns of its
transitions (analytics.evidence._assemble.build_package over rows_of(package)) and compared field by
field, so an edited terminal state, receipt, anomaly list, envelope, input summary, or a
transition's derived field or time is named with both values; each row hash must match its
hashed columns; the ledger comparison made at export must be clean; and, with public keys,
each row must be in the signed log (an RFC 9162 inclusion proof against a head signed by
one of the keys). What one package cannot rebuild alone: what the store said of the
handoff (its findings of source "store": the cross-handoff and fleet kinds and the kinds
only the anomaly passes compute, with the handoffs and fleet groups they involve; in a v1
or v2 package, analytics.evidence._assemble.CROSS_KINDS), the related spans (other spans of the same
traces, which no ledger covers: compared with the store only as a note) and the claimed
columns (parent_span_id, span_name, service_name), and generated_at, which the exporter
states; `offline_notes` says which findings were taken as the package states them.

Against the store (`verify_package`): all of the above, then the package is rebuilt from
the rows stored now, the ledger now and the store's findings re-derived now (the kinds
its `findings_query` asked, over the window it recorded, the clock at generated_at), and
compared again; every stored row must have its ledger entry and be in the signed log; every stored
typed column must agree with its hashed attributes; and each of the package's signed heads
must be a prefix of the store's newest head of the same log (an RFC 9162 consistency proof,
assembled from the stored pieces of the log: O(log n) rows read; analytics.evidence._store_logs).
With several serve instances on one store each log is checked on its own; both ways,
`instance_notes` says per instance how many transitions its signed head proves.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analytics._sql.cohort import check_db
from analytics._sql.rows import fetch_handoff, fetch_ledger_entries
from analytics.evidence._assemble import (
    build_package,
    diff,
    package_sha256,
    parse_iso_ns,
    rows_of,
    typed_mismatches,
)
from analytics.evidence._formats import V1, check_format
from analytics.evidence._log_proofs import check_log_section, section_heads
from analytics.evidence._said import Said, offline_notes, said_by_package, said_by_store
from foundation.integrity import HASHED_COLUMNS, row_hash
from foundation.keys import PublicKeys, SignedHead
from foundation.units import plural

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "VerifyResult",
    "instance_notes",
    "offline_notes",
    "package_sha256",
    "verify_offline",
    "verify_package",
]


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """ok is True when nothing differs; problems name each difference (a field path with
    the package's and the rebuilt value, or a row by span_id); notes say what was not
    checked (e.g. signatures without a public key)."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _require(package: Any) -> None:
    if not isinstance(package, Mapping):
        raise ValueError("evidence package must be a JSON object")
    for key in ("format", "handoff_id", "tenant", "generated_at", "transitions", "integrity"):
        if key not in package:
            raise ValueError(f"evidence package: missing field {key!r}")
    check_format(package["format"])
    if not isinstance(package["transitions"], list) or not package["transitions"]:
        raise ValueError("evidence package: field 'transitions' must be a non-empty list")
    if not isinstance(package["integrity"], Mapping):
        raise ValueError("evidence package: field 'integrity' must be an object")
    try:
        parse_iso_ns(package["generated_at"])
    except ValueError as exc:
        raise ValueError(f"evidence package: generated_at: {exc}") from None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def _differences(package: Mapping[str, Any], rebuilt: Mapping[str, Any], whom: str) -> list[str]:
    """Each differing field; the chain and the checksum are left out when they differ only
    as a consequence (a row hash differs; anything else differs)."""
    found = diff(package, rebuilt)
    if any(p.startswith("transitions[") and p.endswith(".row_hash") for p, _a, _b in found):
        found = [f for f in found if not f[0].startswith(("integrity.chain[", "integrity.chain_"))]
    if len(found) > 1:
        found = [f for f in found if f[0] != "integrity.package_sha256"]
    return [f"{path}: package {_short(a)}, {whom} {_short(b)}" for path, a, b in found]


def _claimed_ledger(package: Mapping[str, Any]) -> dict[str, list[str]]:
    """The ledger lookup the package's own ledger section describes."""
    led = package["integrity"].get("ledger") or {}
    missing, mismatched = set(led.get("missing", [])), set(led.get("mismatched", []))
    out: dict[str, list[str]] = {}
    for t in package["transitions"]:
        if t["span_id"] in missing:
            continue
        out.setdefault(t["span_id"], []).append(
            "0" * 64 if t["span_id"] in mismatched else t["row_hash"]
        )
    return out


def _rebuild(
    package: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    ledger: Mapping[str, Sequence[str]],
    said: Said,
    related_spans: Sequence[Mapping[str, Any]],
    typed: Sequence[str],
) -> dict[str, Any]:
    fmt = str(package["format"])
    rebuilt = build_package(
        rows,
        ledger=ledger,
        as_of_ns=parse_iso_ns(package["generated_at"]),
        extra_anomalies=said.extra,
        related_spans=related_spans,
        log=package["integrity"].get("log"),
        typed_mismatched=typed,
        extra_reasons=said.reasons,
        findings=said.findings,
        findings_query=said.query,
        fmt=fmt,
    )
    if fmt == V1 and not any(t.get("service_name") for t in rows):
        # v1 transitions do not carry service_name: the services are the exporter's claim
        rebuilt["execution"]["services"] = (package.get("execution") or {}).get("services")
    if fmt != V1 and "anomaly_reasons" not in package:  # exported before packages said why
        rebuilt.pop("anomaly_reasons")
    rebuilt["integrity"]["package_sha256"] = package_sha256(rebuilt)
    return rebuilt


def verify_offline(
    package: Mapping[str, Any], *, keys: PublicKeys | None = None, require_log: bool = False
) -> list[str]:
    """Problems found from the package alone (see the module doc): every field against the
    package rebuilt from its rows; row hashes; the export's ledger comparison; with `keys`
    (or `require_log`), the signed head and each row's inclusion proof. Reads and writes
    nothing. Raises ValueError naming the field when the package is malformed."""
    _require(package)
    rows = rows_of(package)
    problems = []
    for i, t in enumerate(package["transitions"]):
        if row_hash(t) != t.get("row_hash"):
            problems.append(
                f"transitions[{i}] (span_id={t['span_id']}): its hashed fields "
                f"({', '.join(HASHED_COLUMNS)}) do not match its row_hash (edited)"
            )
    integ = package["integrity"]
    led = integ.get("ledger") or {}
    rebuilt = _rebuild(
        package,
        rows,
        ledger=_claimed_ledger(package),
        said=said_by_package(package),
        related_spans=package.get("related_spans") or [],
        typed=(integ.get("typed_columns") or {}).get("mismatched", []),
    )
    problems += _differences(package, rebuilt, "rebuilt from its rows")
    for what in ("missing", "mismatched"):
        if led.get(what):
            problems.append(f"integrity.ledger.{what}: at export {led[what]}")
    typed = (integ.get("typed_columns") or {}).get("mismatched")
    if typed:
        problems.append(f"integrity.typed_columns.mismatched: at export {typed}")
    if keys is not None or require_log:
        problems += check_log_section(
            package, keys, generated_at_ns=parse_iso_ns(package["generated_at"])
        )
    return problems


def verify_package(
    client: Client,
    package: Mapping[str, Any],
    *,
    database: str | None = None,
    keys: PublicKeys | None = None,
) -> VerifyResult:
    """Verify a package offline (verify_offline) and against the store as it is now (see
    the module doc); never writes. Raises ValueError for a malformed package."""
    from analytics.evidence._store_logs import StoreLogs
    from analytics.evidence._store_reads import fetch_task_rows, related

    db = check_db(database)
    notes: list[str] = []
    section = package.get("integrity", {}).get("log") if isinstance(package, Mapping) else None
    has_head = isinstance(section, Mapping) and section.get("head") is not None
    problems = verify_offline(package, keys=keys, require_log=has_head)
    if keys is None:
        notes.append("signatures not checked (no --public-key)")
    tenant, hid = str(package["tenant"]), str(package["handoff_id"])
    stored = fetch_handoff(client, db, hid, tenant)
    row_problems = _against_stored(package, stored)
    problems += row_problems
    problems += typed_mismatches(stored)
    entries = fetch_ledger_entries(client, db, tenant, hid)
    ledger = entries.by_span
    for span, now in sorted(_by_span(stored).items()):
        have = ledger.get(span, [])
        for r in now:
            if not have:
                problems.append(f"span_id={span}: stored without a ledger entry (not written "
                                "by serve, or its entry deleted)")  # fmt: skip
                break
            if row_hash(r) not in have:
                problems.append(f"span_id={span}: stored row does not match the ingest ledger")
                break
    if stored:
        task_rows = fetch_task_rows(client, db, tenant, stored[0]["task_id"], stored)
        said, said_notes = said_by_store(client, db, package, stored, task_rows)
        notes += said_notes
        rebuilt = _rebuild(
            package,
            stored,
            ledger=ledger,
            said=said,
            related_spans=package.get("related_spans") or [],
            typed=typed_mismatches(stored),
        )
        problems += _store_differences(package, rebuilt, rows_differ=bool(row_problems))
        related_now = related(client, db, sorted({r["trace_id"] for r in stored}), stored)
        if related_now != package.get("related_spans"):
            notes.append("related_spans differ from the store now (spans of the same traces "
                         "that no ledger covers: context, not proof)")  # fmt: skip
    logs = StoreLogs(client, db)
    pkg_heads: dict[str, SignedHead] = {}
    if has_head:
        try:
            pkg_heads = section_heads(section)  # type: ignore[arg-type]
        except ValueError as exc:
            problems.append(f"integrity.log.{exc}")
    if pkg_heads or logs.heads:
        problems += logs.problems(
            pkg_heads,
            [(r["span_id"], row_hash(r)) for r in stored],
            entries.batches,
            keys,
        )
        notes += instance_notes(section, {i: h.tree_size for i, h in logs.heads.items()})
    else:
        notes.append("no signed head in the package or the store: checked against the store only")
    return VerifyResult(ok=not problems, problems=list(dict.fromkeys(problems)), notes=notes)


def instance_notes(section: Any, store_sizes: Mapping[str, int] | None = None) -> list[str]:
    """One line per serve instance whose log proves a package (several serves on one store),
    from its `integrity.log` (pure): how many transitions are proven against that instance's
    signed head, the head's size and key id and, given `store_sizes` (instance -> size of the
    store's newest head of that log), that size ('none' when the store has no head of it).
    Nothing for a package of the one unnamed log, or a malformed section (its problems say
    why)."""
    if not isinstance(section, Mapping):
        return []
    try:
        heads = section_heads(section)
    except ValueError:
        return []
    if set(heads) <= {""}:
        return []
    entries = section.get("entries") or []
    out = []
    for inst, head in sorted(heads.items()):
        n = sum(1 for e in entries if isinstance(e, Mapping) and e.get("index") is not None
                and e.get("instance", head.instance if len(heads) == 1 else None) == inst)  # fmt: skip
        line = (f"log of instance {inst or '(none)'}: {plural(n, 'transition')} proven against its "
                f"head of size {head.tree_size} signed by key {head.key_id}")  # fmt: skip
        if store_sizes is not None:
            now = store_sizes.get(inst)
            line += f"; the store's newest head of it has size {'none' if now is None else now}"
        out.append(line)
    return out


_ROW_FIELDS = frozenset({*HASHED_COLUMNS, "time", "row_hash", "arrivals"})


def _store_differences(
    package: Mapping[str, Any], rebuilt: Mapping[str, Any], *, rows_differ: bool
) -> list[str]:
    """Fields of the package that differ from the package rebuilt from the store. When
    stored rows were already named as added, deleted or altered, only what those messages do
    not say: the derived fields of a transition still at the same place (with its span id);
    the rest (terminal state, chain, ledger counts...) follows from the rows named."""
    if not rows_differ:
        return _differences(package, rebuilt, "rebuilt from the store")
    out = []
    mine, theirs = package["transitions"], rebuilt["transitions"]
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a.get("span_id") != b.get("span_id"):
            continue
        for path, va, vb in diff(a, b, f"transitions[{i}]"):
            name = path.split(".", 1)[1].split("[", 1)[0].split(".", 1)[0]
            if name not in _ROW_FIELDS:
                out.append(f"{path} (span_id={a['span_id']}): package {_short(va)}, "
                           f"rebuilt from the store {_short(vb)}")  # fmt: skip
    return out


def _by_span(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["span_id"]].append(r)
    return out


def _against_stored(package: Mapping[str, Any], stored: Sequence[Mapping[str, Any]]) -> list[str]:
    """Rows deleted, added, or altered (hashed columns named) since the package was made."""
    problems = []
    by_span = _by_span(stored)
    packaged = _by_span(package["transitions"])
    for span, pts in packaged.items():
        now = by_span.get(span, [])
        if not now:
            problems.append(f"span_id={span}: in the package but no longer stored (deleted)")
            continue
        now_hashes = Counter(row_hash(r) for r in now)
        then_hashes: Counter[str] = Counter()
        for t in pts:
            then_hashes[t["row_hash"]] += t.get("arrivals", 1)
        if set(then_hashes) != set(now_hashes):
            cols = _diff_columns(pts[0], now[0])
            what = f" (column {', '.join(cols)})" if cols else ""
            problems.append(f"span_id={span}: stored row differs from the package{what}")
        elif then_hashes != now_hashes:
            problems.append(
                f"span_id={span}: stored {now_hashes.total()} times, the package recorded "
                f"{then_hashes.total()} arrivals (a copy added or deleted after export)"
            )
        # a span id may carry several transitions (each its own row hash): each packaged
        # one is compared with the stored rows of its own hash
        same_hash: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in now:
            same_hash[row_hash(r)].append(r)
        for t in pts:
            peers = same_hash.get(t["row_hash"]) or now
            # (a handoff-evidence/v1 transition carries parent_span_id only)
            for c in (c for c in ("parent_span_id", "span_name", "service_name") if c in t):
                if all(t.get(c) != r.get(c) for r in peers):
                    problems.append(f"span_id={span}: stored {c} {peers[0].get(c)!r} differs "
                                    f"from the package's {t.get(c)!r}")  # fmt: skip
    for span in sorted(set(by_span) - set(packaged)):
        problems.append(f"span_id={span}: stored but not in the package (added after export)")
    return problems


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
