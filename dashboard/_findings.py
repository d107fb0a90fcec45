"""The Explorer's "Anomalies" panel: every anomaly kind that flags the handoff shown, from its
evidence package's `findings` (analytics.evidence._findings): the handoff's own kinds, the
cross-handoff kinds with links to the other handoffs involved, and the fleet kinds that
covered it, by reference (to_agent, capability and hours, linked to the Anomalies page over
those hours). A package without findings (an earlier format) lists its kinds alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import streamlit as st

from dashboard import _ui

__all__ = ["finding_lines", "findings_of", "findings_panel"]

_SCOPE: Final = {
    "handoff": "its own transitions",
    "cross": "with other handoffs",
    "fleet": "fleet",
    "unclassified": "scope not classified",
}
_SOURCE: Final = {
    "rows": "rebuilt from its transitions",
    "store": "judged from the store at export",
}


def findings_of(package: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The package's findings; for a package without them, one per kind of `anomalies`
    (scope and source unknown)."""
    got = package.get("findings")
    if isinstance(got, list):
        return [f for f in got if isinstance(f, Mapping) and isinstance(f.get("kind"), str)]
    return [{"kind": str(k)} for k in package.get("anomalies") or []]


def _hours(start: str, end: str) -> str:
    """'2026-11-23 10:00–11:00 UTC' (the end's date too when it is another day)."""
    a, b = (t[:16].replace("T", " ") for t in (start, end))
    return f"{a}–{b[11:] if a[:10] == b[:10] else b} UTC"


def _fleet(ref: Mapping[str, Any]) -> str:
    start, end = str(ref.get("start") or ""), str(ref.get("end") or "")
    link = f"anomalies?from={quote(start[:19] + 'Z', safe='')}&to={quote(end[:19] + 'Z', safe='')}"
    cap = str(ref.get("capability") or "")
    return (
        f"to_agent `{_ui.user_text(ref.get('to_agent') or _ui.DASH)}`, capability "
        f"`{_ui.user_text(cap) if cap else '(none)'}`, [{_hours(start, end)}]({link})"
    )


def finding_lines(package: Mapping[str, Any]) -> list[str]:
    """One Markdown bullet per finding (pure): kind, what it involves, where it comes from,
    and the kind's definition below it (analytics.anomaly_kinds.DESCRIPTIONS)."""
    from analytics.anomaly_kinds import DESCRIPTIONS

    lines = []
    for f in findings_of(package):
        kind = str(f["kind"])
        parts = [f"**{_ui.user_text(kind)}**"]
        if f.get("scope"):
            parts.append(_SCOPE.get(str(f["scope"]), _ui.user_text(f["scope"])))
        others = [str(h) for h in f.get("handoffs") or []]
        if others:
            parts.append(
                "involves "
                + ", ".join(f"[{_ui.user_text(h, 200)}]({_ui.explorer_link(h)})" for h in others)
            )
        fleet = [r for r in f.get("fleet") or [] if isinstance(r, Mapping)]
        if fleet:
            parts.append("covered by " + "; ".join(_fleet(r) for r in fleet))
        if f.get("source"):
            parts.append(_SOURCE.get(str(f["source"]), _ui.user_text(f["source"])))
        lines.append("- " + " · ".join(parts))
        if kind in DESCRIPTIONS:
            lines.append(f"    - :gray[{_ui.user_text(DESCRIPTIONS[kind], 400)}]")
    return lines


def findings_panel(package: Mapping[str, Any]) -> None:
    """The panel: "Anomalies", then one line per finding, or "none"."""
    st.markdown("**Anomalies**")
    lines = finding_lines(package)
    if not lines:
        st.write("none")
        return
    n = len(findings_of(package))
    st.caption(
        f"{n} kind{'s' if n != 1 else ''} of the anomaly report flag this handoff: its own, "
        "those it shares with other handoffs (linked), and the fleet verdicts that covered it. "
        "A kind rebuilt from its transitions verifies offline; one judged from the store is "
        "judged again by `handoffs evidence verify --store`."
    )
    st.markdown("\n".join(lines))
