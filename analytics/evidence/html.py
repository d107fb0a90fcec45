"""Evidence packages for people: a terminal summary and one self-contained HTML page.

Pure functions of a package (or a task bundle) and a `Verdict` (what `evidence verify`
found, or why nothing was verified). The page loads nothing from anywhere (inline CSS, no
scripts, no images, no links to other hosts), so it opens offline, can be mailed, and
prints to PDF as it is shown. Values from the package are escaped; anomalies are shown as
the package holds them (a kind, or a kind with its reasons).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from analytics.evidence._assemble import iso_ns

__all__ = ["GLOSSARY", "Verdict", "anomaly_items", "packages_of", "render_html", "summary_lines"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """`ok` True (PASS), False (FAIL) or None (not verified: `how` says why)."""

    ok: bool | None
    how: str
    problems: Sequence[str] = field(default_factory=tuple)
    notes: Sequence[str] = field(default_factory=tuple)

    def headline(self) -> str:
        if self.ok is None:
            return f"NOT VERIFIED: {self.how}"
        if self.ok:
            return f"PASS: the package is intact and matches its proofs ({self.how})"
        return f"FAIL: the package does not match its proofs ({self.how}); {len(self.problems)} problem(s) below"


GLOSSARY: Final = (
    ("Handoff", "one piece of work passed from one agent to another, from its creation to its end"),
    (
        "Transition",
        "one recorded step of a handoff (created, accepted, running, committed, ...), "
        "with who made it and when",
    ),
    (
        "Row hash",
        "a SHA-256 fingerprint of a transition's recorded fields: change one character "
        "and it no longer matches",
    ),
    ("Hash chain", "the row hashes linked in order, each link covering every link before it"),
    (
        "Signed log",
        "the append-only Merkle tree of every stored transition; the server signs its "
        "head (size and root) with its private key",
    ),
    ("Signed head", "the signed statement 'the log had N entries with this root at this time'"),
    ("Inclusion proof", "the few hashes that show one transition is inside a signed head"),
    ("Public key", "the file (.pub) that checks the server's signatures; it cannot sign"),
    (
        "PASS",
        "every field was rebuilt from the recorded transitions and matched, and (with a "
        "key) every transition is proven in the signed log",
    ),
    ("FAIL", "something was changed, removed or cannot be proven; each problem is listed"),
)


def packages_of(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The packages of a package (itself) or of a task bundle."""
    packs = doc.get("packages")
    return list(packs) if isinstance(packs, list) else [doc]


def anomaly_items(pkg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, reason) per anomaly as the package holds it; reason "" when it has none. The
    reason is its `anomaly_reasons` sentence, then what its finding involves (the other
    handoffs; the fleet group and hours)."""
    extra: dict[str, Any] = {}
    for k, v in pkg.items():  # a map kind -> reason(s) beside the list, if the package has one
        if k != "anomalies" and k.startswith("anomal") and isinstance(v, Mapping):
            extra.update(v)
    said = {
        str(a["kind"]): str(a["reason"].get("sentence") or "")
        for a in pkg.get("anomaly_reasons") or []
        if isinstance(a, Mapping) and "kind" in a and isinstance(a.get("reason"), Mapping)
    }
    found = {
        str(f["kind"]): f
        for f in pkg.get("findings") or []
        if isinstance(f, Mapping) and "kind" in f
    }
    out = []
    for a in pkg.get("anomalies") or []:
        if isinstance(a, Mapping):
            kind = str(a.get("kind") or a.get("name") or "")
            rest = {k: v for k, v in a.items() if k not in ("kind", "name")}
            out.append((kind, _reason(rest.get("reasons") or rest.get("reason") or rest)))
        else:
            text = _reason(extra.get(str(a), "")) or said.get(str(a), "")
            more = _involves(found.get(str(a)) or {})
            out.append((str(a), "; ".join(x for x in (text, more) if x)))
    return out


def _involves(finding: Mapping[str, Any]) -> str:
    """'involves h-1, h-2' / 'fleet: to_agent a, capability c, <start> to <end>' ("" none)."""
    parts = []
    others = [str(h) for h in finding.get("handoffs") or []]
    if others:
        parts.append("involves " + ", ".join(others))
    for g in finding.get("fleet") or []:
        if isinstance(g, Mapping):
            parts.append(f"fleet: to_agent {g.get('to_agent') or '?'}, capability "
                         f"{g.get('capability') or '(none)'}, {g.get('start')} to {g.get('end')}")  # fmt: skip
    return "; ".join(parts)


def _reason(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping):
        return "; ".join(f"{k}: {_reason(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "; ".join(_reason(x) for x in v)
    return "" if v is None else str(v)


def _proofs(pkg: Mapping[str, Any]) -> list[str]:
    integ = pkg.get("integrity") or {}
    led = integ.get("ledger") or {}
    log = integ.get("log") or {}
    out = [
        f"hash chain over {len(pkg.get('transitions') or [])} transitions, head "
        f"{str(integ.get('chain_head', ''))[:16]}…",
        f"ingest ledger at export: {led.get('matched', 0)}/{led.get('rows', 0)} rows matched, "
        f"{len(led.get('mismatched') or [])} differ, {len(led.get('missing') or [])} without entry",
    ]
    heads = log.get("heads") or ({"": log["head"]} if log.get("head") else {})
    for inst, h in heads.items():
        of = f" of instance {inst}" if inst else ""
        out.append(
            f"signed head{of}: {h['tree_size']:,} entries, signed "
            f"{iso_ns(int(h['signed_at']))[:19]}Z by key {h['key_id']}"
        )
    entries = log.get("entries") or []
    if heads:
        proven = len(entries) - len(log.get("pending") or [])
        out.append(
            f"inclusion proofs: {proven}/{len(entries)} transitions proven in the signed "
            f"log, {len(log.get('pending') or [])} not yet signed"
        )
    else:
        out.append(
            "no signed head: the server ran without a signing key, so this package can "
            "be checked only against the store"
        )
    if log.get("note"):
        out.append(str(log["note"]))
    out.append(f"package checksum (sha256): {integ.get('package_sha256', '')}")
    return out


def _when(t: Mapping[str, Any]) -> str:
    if "time_ns" in t:
        return iso_ns(int(t["time_ns"]))
    return str(t.get("time", ""))


def summary_lines(doc: Mapping[str, Any], verdict: Verdict) -> list[str]:
    """A plain-text summary of `doc` (package or task bundle) headed by the verdict."""
    lines = [verdict.headline()]
    lines += [f"  - {p}" for p in verdict.problems]
    lines += [f"  note: {n}" for n in verdict.notes]
    for pkg in packages_of(doc):
        env = pkg.get("envelope") or {}
        term = pkg.get("terminal") or {}
        lines += [
            "",
            f"handoff {pkg.get('handoff_id')}  task {pkg.get('task_id')}  tenant {pkg.get('tenant')}",
            f"  {env.get('from_agent') or '?'} -> {env.get('to_agent') or '?'}, mode "
            f"{env.get('mode') or '?'}; ended {term.get('state') or 'open'}; exported "
            f"{pkg.get('generated_at')}",
            "  transitions:",
        ]
        for t in pkg.get("transitions") or []:
            lines.append(
                f"    {_when(t)}  {t.get('event'):<9} {t.get('from_state') or '∅'} -> "
                f"{t.get('to_state')}  by {t.get('actor')}"
            )
        refs = pkg.get("evidence_refs") or []
        lines.append(f"  evidence refs: {', '.join(map(str, refs)) or 'none'}")
        items = anomaly_items(pkg)
        lines.append(f"  anomalies: {'none' if not items else ''}")
        lines[-1] = lines[-1].rstrip()
        lines += [f"    - {k}" + (f": {r}" if r else "") for k, r in items]
        lines += ["  proofs:", *(f"    {p}" for p in _proofs(pkg))]
    return lines


_CSS: Final = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;
max-width:1100px;margin:24px auto;padding:0 20px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:14px 0 4px}.muted{color:#57606a}
.verdict{padding:12px 16px;border-radius:6px;font-weight:600;margin:14px 0;border:2px solid}
.pass{background:#dafbe1;border-color:#1a7f37;color:#0f5323}
.fail{background:#ffebe9;border-color:#cf222e;color:#82071e}
.none{background:#f6f8fa;border-color:#8c959f;color:#424a53}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:4px 0}
th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.mono,span.mono{font-family:ui-monospace,Menlo,Consolas,monospace;
word-break:break-all}dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:4px 0}
dt{font-weight:600}dd{margin:0}ul{margin:4px 0;padding-left:20px}
section.pkg{page-break-inside:auto;margin-bottom:18px}
@media print{body{margin:0;max-width:none}.verdict{-webkit-print-color-adjust:exact;
print-color-adjust:exact}h2{page-break-after:avoid}tr{page-break-inside:avoid}}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _pkg_html(pkg: Mapping[str, Any]) -> str:
    env = pkg.get("envelope") or {}
    term = pkg.get("terminal") or {}
    receipt = term.get("receipt") or {}
    facts = [
        ("Task", pkg.get("task_id")),
        ("Tenant", pkg.get("tenant")),
        ("From → to", f"{env.get('from_agent') or '?'} → {env.get('to_agent') or '?'}"),
        ("Mode", env.get("mode")),
        ("Protocol", env.get("protocol")),
        ("Capabilities", ", ".join(map(str, env.get("capabilities") or [])) or None),
        ("Objective", (pkg.get("input_summary") or {}).get("objective_summary") or None),
        (
            "Final state",
            f"{term.get('state') or 'open'}"
            + ("" if term.get("is_terminal") else " (not finished)"),
        ),
        (
            "Receipt",
            f"{receipt.get('status')} {receipt.get('hash')}" if receipt.get("status") else None,
        ),
        ("Exported at", pkg.get("generated_at")),
    ]
    rows = "".join(
        f"<tr><td class=mono>{_e(_when(t))}</td><td>{_e(t.get('event'))}</td>"
        f"<td>{_e(t.get('from_state') or '∅')} → {_e(t.get('to_state'))}</td><td>{_e(t.get('actor'))}</td>"
        f"<td>{_e(t.get('evidence_count') if t.get('evidence_count') is not None else '')}"
        f"{'' if t.get('evidence_valid') is None else (' valid' if t.get('evidence_valid') else ' invalid')}</td>"
        f"<td>{'yes' if t.get('counted', True) else 'no'}</td><td>{_e(t.get('arrivals', 1))}</td>"
        f"<td class=mono>{_e(t.get('span_id'))}</td></tr>"
        for t in pkg.get("transitions") or []
    )
    refs = pkg.get("evidence_refs") or []
    items = anomaly_items(pkg)
    anomalies = (
        "<ul>"
        + "".join(f"<li><b>{_e(k)}</b>" + (f": {_e(r)}" if r else "") + "</li>" for k, r in items)
        + "</ul>"
        if items
        else "<p>None found.</p>"
    )
    return (
        f"<section class=pkg><h2>Handoff <span class=mono>{_e(pkg.get('handoff_id'))}</span></h2>"
        "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v) + "</dl>"
        "<h3>Transitions (times in UTC)</h3><table><thead><tr><th>time</th><th>event</th>"
        "<th>state change</th><th>actor</th><th>evidence</th><th>counted</th><th>stored</th>"
        f"<th>span id</th></tr></thead><tbody>{rows}</tbody></table>"
        "<h3>Evidence references</h3>"
        + (
            "<ul>" + "".join(f"<li class=mono>{_e(r)}</li>" for r in refs) + "</ul>"
            if refs
            else "<p>None.</p>"
        )
        + f"<h3>Anomalies</h3>{anomalies}<h3>Proofs</h3><ul>"
        + "".join(f"<li>{_e(p)}</li>" for p in _proofs(pkg))
        + "</ul></section>"
    )


def render_html(doc: Mapping[str, Any], verdict: Verdict, *, source: str = "") -> str:
    """One self-contained HTML page of `doc` (package or task bundle) and `verdict`."""
    packs = packages_of(doc)
    title = (
        f"Evidence: task {doc.get('task_id')} ({len(packs)} handoffs)"
        if "packages" in doc
        else f"Evidence: handoff {doc.get('handoff_id')}"
    )
    cls = "none" if verdict.ok is None else ("pass" if verdict.ok else "fail")
    details = "".join(f"<li>{_e(p)}</li>" for p in verdict.problems)
    details += "".join(f"<li class=muted>{_e(n)}</li>" for n in verdict.notes)
    gloss = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in GLOSSARY)
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><p class=muted>{_e(source)} · format {_e(doc.get('format'))}"
        f" · generated {_e(doc.get('generated_at'))}</p>"
        f"<div class='verdict {cls}'>{_e(verdict.headline())}</div>"
        + (f"<ul>{details}</ul>" if details else "")
        + "".join(_pkg_html(p) for p in packs)
        + f"<h2>Glossary</h2><dl>{gloss}</dl></body></html>\n"
    )
