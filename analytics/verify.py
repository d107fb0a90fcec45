"""Verifying evidence packages: offline (hash, row hashes, chain) and against the store now."""

from __future__ import annotations

import copy
import hashlib
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analytics._common import check_db
from analytics._rows import fetch_handoff, fetch_ledger
from foundation.integrity import GENESIS, HASHED_COLUMNS, canonical_json, chain, row_hash

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["VerifyResult", "package_sha256", "verify_offline", "verify_package"]


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """ok is True when nothing differs; problems name each differing row (span_id, column)."""

    ok: bool
    problems: list[str] = field(default_factory=list)


def package_sha256(package: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of `package` without integrity.package_sha256."""
    body = copy.deepcopy(dict(package))
    integ = dict(body.get("integrity") or {})
    integ.pop("package_sha256", None)
    body["integrity"] = integ
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


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
        n = t.get("arrivals", 1)  # packages made before `arrivals` list every copy
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"evidence package: transitions[{i}].arrivals must be an int >= 1")


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
    every packaged row must still be stored with the same row hash, as many times as its
    `arrivals` (differing columns named), no row may have been added (a copy included), and
    each stored row must match transition_ledger (where the package found a ledger entry at
    export). Raises ValueError for a malformed package."""
    db = check_db(database)
    problems = verify_offline(package)
    tenant, hid = str(package["tenant"]), str(package["handoff_id"])
    stored = fetch_handoff(client, db, hid, tenant)
    by_span: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in stored:
        by_span[r["span_id"]].append(r)
    ledger = fetch_ledger(client, db, tenant, hid)
    no_ledger_at_export = set(package["integrity"].get("ledger", {}).get("missing", []))
    packaged: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for t in package["transitions"]:
        packaged[t["span_id"]].append(t)
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
