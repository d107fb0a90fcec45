"""What the store said of a handoff, as verify takes it (analytics.evidence.verify): from the
package itself offline (taken as given, and `offline_notes` says so), or asked of the store
again.

A v1 or v2 package took its cross-handoff kinds (idempotency_conflict, stale_fence, bounce)
from the task's other handoffs; a v3 package took every finding of source "store"
(analytics.evidence._findings) as its `findings_query` records. Either way those are what
one package cannot rebuild from its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analytics.evidence._assemble import parse_iso_ns
from analytics.evidence._formats import V2_CROSS_KINDS, V3
from analytics.evidence._why_task import cross_reasons

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["Said", "offline_notes", "said_by_package", "said_by_store"]


@dataclass(frozen=True, slots=True)
class Said:
    """What the store said of the handoff, as a rebuild takes it: v1/v2 cross kinds
    (`extra`), v3 findings of source "store" and the query that asked them, their reasons."""

    extra: Sequence[str] = ()
    findings: Sequence[Mapping[str, Any]] = ()
    query: Mapping[str, Any] | None = None
    reasons: Sequence[Any] = ()


def _store_kinds_of(package: Mapping[str, Any]) -> set[str]:
    """The kinds the package took from the store: v3 its findings of source "store", v1/v2
    its cross kinds."""
    if package.get("format") != V3:
        return set(package.get("anomalies") or []) & V2_CROSS_KINDS
    return {
        str(f["kind"])
        for f in package.get("findings") or []
        if isinstance(f, Mapping) and f.get("source") == "store" and "kind" in f
    }


def said_by_package(package: Mapping[str, Any]) -> Said:
    """What the package says the store said (offline, taken as given)."""
    kinds = _store_kinds_of(package)
    reasons = [
        a["reason"]
        for a in package.get("anomaly_reasons") or []
        if isinstance(a, Mapping)
        and a.get("kind") in kinds
        and isinstance(a.get("reason"), Mapping)
    ]
    if package.get("format") != V3:
        return Said(extra=sorted(kinds), reasons=reasons)
    findings = package.get("findings")
    if not isinstance(findings, list):
        raise ValueError("evidence package: field 'findings' must be a list")
    query = package.get("findings_query")
    if query is not None and not isinstance(query, Mapping):
        raise ValueError("evidence package: findings_query must be an object or null")
    return Said(
        findings=[f for f in findings if isinstance(f, Mapping) and f.get("kind") in kinds],
        query=query,
        reasons=reasons,
    )


def offline_notes(*packages: Mapping[str, Any]) -> list[str]:
    """What an offline verification of `packages` (one, or a task bundle's) takes as the
    packages state it (pure): the findings the store gave at export, which only a
    verification against a store (--store) re-derives. Empty when there are none."""
    kinds: set[str] = set()
    asked = 0
    for pkg in packages:
        if not isinstance(pkg, Mapping):
            continue
        kinds |= _store_kinds_of(pkg)
        query = pkg.get("findings_query")
        if pkg.get("format") != V3:
            asked = max(asked, len(V2_CROSS_KINDS))
        elif isinstance(query, Mapping) and isinstance(query.get("kinds"), list):
            asked = max(asked, len(query["kinds"]))
    if not asked:
        return []
    if kinds:
        return [f"offline: the store's findings at export ({', '.join(sorted(kinds))}) are taken "
                f"as the package states them ({asked} kinds come from other handoffs or the "
                "anomaly passes, not its own rows); verify with --store to re-derive them"]  # fmt: skip
    return [f"offline: none of the {asked} kinds that come from other handoffs or the anomaly "
            "passes flagged it at export, as the package states; verify with --store to "
            "re-derive them"]  # fmt: skip


def said_by_store(
    client: Client,
    db: str,
    package: Mapping[str, Any],
    stored: Sequence[Mapping[str, Any]],
    task_rows: Sequence[Mapping[str, Any]],
) -> tuple[Said, list[str]]:
    """What the store says of the handoff now, asked as the package's format asked it: v1/v2
    the cross kinds; v3 the kinds of its findings_query over its window, the clock at its
    generated_at (a kind this version's passes lack is taken as the package states it,
    and a note says so)."""
    from analytics.evidence._store_reads import cross_anomalies, store_findings

    hid, tenant = str(package["handoff_id"]), str(package["tenant"])
    if package.get("format") != V3:
        cross = cross_anomalies(client, db, tenant, stored, task_rows, hid)
        said = Said(extra=cross, reasons=cross_reasons(client, db, cross, stored, task_rows))
        return said, [f"re-derived from the store now: {', '.join(sorted(V2_CROSS_KINDS))} "
                      f"(found: {', '.join(cross) or 'none'})"]  # fmt: skip
    query = package.get("findings_query")
    if query is None:
        return Said(), ["the package asked the store nothing (no findings_query): its store "
                         "findings were not re-derived"]  # fmt: skip
    if not isinstance(query, Mapping):
        raise ValueError("evidence package: findings_query must be an object or null")
    got = store_findings(
        client, db, stored, task_rows, as_of_ns=parse_iso_ns(package["generated_at"]), query=query
    )
    findings: list[Any] = list(got.findings)
    reasons: list[Any] = list(got.reasons)
    asked = [k for k in query.get("kinds") or [] if k not in got.unknown]
    notes = [f"re-derived from the store now: the {len(asked)} kinds the package asked over "
             f"{query.get('window_start')} to {query.get('window_end')} (found: "
             f"{', '.join(f.kind for f in got.findings) or 'none'})"]  # fmt: skip
    if got.unknown:
        mine = said_by_package(package)
        findings += [f for f in mine.findings if f.get("kind") in got.unknown]
        reasons += [r for r in mine.reasons if r.get("kind") in got.unknown]
        notes.append(f"kinds this version does not compute were not re-derived (taken as the "
                     f"package states them): {', '.join(got.unknown)}")  # fmt: skip
    return Said(findings=findings, query=query, reasons=reasons), notes
