"""Bulk export of evidence packages: one package per handoff, chosen by task, agent, tenant
and creation window, plus a manifest that ties the files together.

A directory export holds `<handoff>.json` per handoff (analytics.evidence.package's package, all
built against one reading of the signed logs, so they prove against the same heads) and
`manifest.json` (format handoff-evidence-export/v1): what was selected, each file's
SHA-256, the signed heads the packages prove against, and counts. The manifest is not
signed: it lets an auditor notice a file added, removed or edited, and each package still
proves itself. `verify_export` checks the manifest and every package (offline with public
keys, or against the store). The same export can be written into a zip (`zip_export`) for
a browser download.

Selection: a handoff is exported when it matches every criterion given: its task, an
agent it names (as from_agent, to_agent or actor of any of its rows), the tenant, and its
first stored transition inside [start, end). At most `MAX_HANDOFFS` handoffs per export.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.cohort import check_db, ns
from analytics._sql.rows import fetch_handoff
from analytics.evidence._assemble import iso_ns
from analytics.evidence._store_logs import StoreLogs
from analytics.evidence.package import _package
from analytics.evidence.verify import VerifyResult, offline_notes, verify_offline, verify_package

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from foundation.keys import PublicKeys

__all__ = [
    "EXPORT_FORMAT",
    "MANIFEST",
    "MAX_HANDOFFS",
    "Selection",
    "export",
    "select_handoffs",
    "verify_export",
    "zip_export",
]

EXPORT_FORMAT: Final = "handoff-evidence-export/v1"
MANIFEST: Final = "manifest.json"
#: handoffs per export at most (each package is a few KB to a few hundred KB)
MAX_HANDOFFS: Final = 20_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Selection:
    """Which handoffs to export; at least one of task_id, agent, start, end. Times UTC."""

    task_id: str | None = None
    agent: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not (self.task_id or self.agent or self.start or self.end):
            raise ValueError("choose the handoffs: a task, an agent or a time window")
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"window: start {self.start} is not before end {self.end}")

    def as_dict(self) -> dict[str, str]:
        out = {"task_id": self.task_id, "agent": self.agent, "tenant": self.tenant}
        out["from"] = iso_ns(ns(self.start)) if self.start else None
        out["to"] = iso_ns(ns(self.end)) if self.end else None
        return {k: v for k, v in out.items() if v}


def select_handoffs(
    client: Client, *, database: str | None = None, selection: Selection
) -> list[tuple[str, str]]:
    """(tenant, handoff_id) of the selected handoffs, by first stored transition time.
    ValueError when more than MAX_HANDOFFS match."""
    db = check_db(database)
    where, having = ["1"], ["1"]
    params: dict[str, Any] = {}
    if selection.task_id:
        where.append("task_id = {k:String}")
        params["k"] = selection.task_id
    if selection.tenant is not None:
        where.append("tenant = {t:String}")
        params["t"] = selection.tenant
    if selection.agent:
        having.append(
            "countIf(from_agent = {a:String} OR to_agent = {a:String} OR actor = {a:String}) > 0"
        )
        params["a"] = selection.agent
    if selection.start:
        having.append("first >= fromUnixTimestamp64Nano({s:Int64})")
        params["s"] = ns(selection.start)
    if selection.end:
        having.append("first < fromUnixTimestamp64Nano({e:Int64})")
        params["e"] = ns(selection.end)
    rows = client.query(
        f"SELECT tenant, handoff_id, min(time) AS first FROM {db}.handoff_transitions "
        f"WHERE {' AND '.join(where)} GROUP BY tenant, handoff_id HAVING {' AND '.join(having)} "
        f"ORDER BY first, handoff_id LIMIT {MAX_HANDOFFS + 1}",
        parameters=params,
    ).result_rows
    if len(rows) > MAX_HANDOFFS:
        raise ValueError(
            f"more than {MAX_HANDOFFS:,} handoffs match; narrow the selection (a shorter window)"
        )
    return [(str(t), str(h)) for t, h, _first in rows]


def _file_name(tenant: str, handoff_id: str, taken: set[str]) -> str:
    name = _UNSAFE.sub("_", handoff_id)[:120] or "handoff"
    if name in taken or name != handoff_id or name == MANIFEST.removesuffix(".json"):
        name += "-" + hashlib.sha256(f"{tenant}\n{handoff_id}".encode()).hexdigest()[:8]
    taken.add(name)
    return name + ".json"


def _heads(pkg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    log = pkg["integrity"].get("log") or {}
    if log.get("heads"):
        return dict(log["heads"])
    head = log.get("head")
    return {str(head.get("instance", "")): head} if head else {}


def export(
    client: Client,
    *,
    database: str | None = None,
    selection: Selection,
    write: Callable[[str, bytes], None],
    as_of: datetime | None = None,
    progress: Callable[[list[tuple[str, str]]], Iterable[tuple[str, str]]] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write one package per selected handoff and then MANIFEST through `write(name,
    bytes)`; returns the manifest. `progress` wraps the list of handoffs as they are built
    (e.g. tqdm); `facts` are added to the manifest as they are (e.g. late signing)."""
    db = check_db(database)
    chosen = select_handoffs(client, database=db, selection=selection)
    logs = StoreLogs(client, db)
    now_ns = ns(as_of or datetime.now(UTC))
    files: dict[str, str] = {}
    heads: dict[str, dict[str, Any]] = {}
    taken: set[str] = set()
    transitions = pending = 0
    for tenant, hid in progress(chosen) if progress else chosen:
        rows = fetch_handoff(client, db, hid, tenant)
        if not rows:  # deleted since the selection
            continue
        pkg = _package(client, db, rows, now_ns, logs)
        data = (json.dumps(pkg, indent=2, ensure_ascii=False) + "\n").encode()
        name = _file_name(tenant, hid, taken)
        write(name, data)
        files[name] = hashlib.sha256(data).hexdigest()
        heads.update(_heads(pkg))
        transitions += len(pkg["transitions"])
        pending += len((pkg["integrity"].get("log") or {}).get("pending") or [])
    manifest: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "generated_at": iso_ns(now_ns),
        "database": db,
        "selection": selection.as_dict(),
        "heads": heads,
        "counts": {"handoffs": len(files), "transitions": transitions, "unsigned": pending},
        "files": files,
        **(facts or {}),
    }
    write(MANIFEST, (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode())
    return manifest


def zip_export(client: Client, *, database: str | None = None, selection: Selection) -> bytes:
    """The export of `selection` as a zip file (the packages and the manifest)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        export(client, database=database, selection=selection, write=zf.writestr)
    return buf.getvalue()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an export directory; ValueError saying what is wrong."""
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: not an evidence export manifest ({EXPORT_FORMAT})")
    if not isinstance(doc.get("files"), dict):
        raise ValueError(f"{path}: field 'files' must map file names to sha256")
    return doc


def verify_export(
    directory: Path,
    *,
    client: Client | None = None,
    database: str | None = None,
    keys: PublicKeys | None = None,
    progress: Callable[[list[str]], Iterable[str]] | None = None,
) -> VerifyResult:
    """Check an export directory as a whole: each file listed with its SHA-256, no package
    file unlisted, the counts, each package against the manifest's heads, and each package
    (offline with `keys` when `client` is None, else against the store). Every problem
    names its file. ValueError when the manifest cannot be read."""
    manifest = read_manifest(directory)
    problems: list[str] = []
    notes: list[str] = []
    said: list[dict[str, Any]] = []  # what each package took from the store (offline notes)
    listed: dict[str, str] = manifest["files"]
    on_disk = {p.name for p in directory.glob("*.json")} - {MANIFEST}
    problems += [
        f"{n}: in the directory but not in the manifest" for n in sorted(on_disk - set(listed))
    ]
    transitions = 0
    names = sorted(listed)
    for name in progress(names) if progress else names:
        path = directory / name
        if Path(name).name != name:
            problems.append(f"{MANIFEST}: file name {name!r} is not a plain file name")
            continue
        try:
            data = path.read_bytes()
        except OSError:
            problems.append(f"{name}: listed in the manifest but missing")
            continue
        if hashlib.sha256(data).hexdigest() != listed[name]:
            problems.append(f"{name}: edited after export (its sha256 differs from the manifest)")
        try:
            pkg = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{name}: not JSON ({exc})")
            continue
        transitions += len(pkg.get("transitions") or [])
        for inst, head in _heads(pkg).items():
            if (manifest.get("heads") or {}).get(inst) != head:
                problems.append(f"{name}: proves against another signed head than the manifest's")
        try:
            if client is None:
                found = verify_offline(pkg, keys=keys, require_log=True)
                said.append(
                    {k: pkg.get(k) for k in ("format", "anomalies", "findings", "findings_query")}
                )
            else:
                res = verify_package(client, pkg, database=database, keys=keys)
                found = res.problems
                notes += [n for n in res.notes if n not in notes]
        except ValueError as exc:
            found = [str(exc)]
        problems += [f"{name}: {p}" for p in found]
    counts = manifest.get("counts") or {}
    if counts.get("handoffs") != len(listed) or counts.get("transitions") != transitions:
        problems.append(
            f"{MANIFEST}: counts {counts} do not match the files "
            f"({len(listed)} handoffs, {transitions} transitions)"
        )
    if client is None:
        notes.append("offline: checked against the signed log only, no store")
        notes += offline_notes(*said)
    return VerifyResult(ok=not problems, problems=problems, notes=notes)
