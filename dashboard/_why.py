"""The Explorer's "Why flagged" panel and the tables that must agree with it (transitions,
evidence references), and ids shown so that two handoffs never look alike: whole, in tables
with columns as wide as the longest id, and with a copy button where one handoff is shown. Reads the evidence package's `anomaly_reasons`
(analytics.evidence._why); a package exported before those existed shows its kinds alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pandas as pd
import streamlit as st

from dashboard import _ui

#: pixels per character of an id in a table cell, and the cell's padding (px)
_CHAR_PX: Final = 8
_PAD_PX: Final = 28


def copyable(label: str, value: str) -> None:
    """A small label over `value` in a code block (its copy button copies it whole)."""
    st.caption(label)
    st.code(value or _ui.DASH, language=None)


def reasons(package: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """[{"kind", "reason"}] of the package; for a package without `anomaly_reasons`, one
    entry per kind with an empty reason."""
    got = package.get("anomaly_reasons")
    if isinstance(got, list):
        return [a for a in got if isinstance(a, Mapping) and isinstance(a.get("reason"), Mapping)]
    return [{"kind": str(k), "reason": {}} for k in package.get("anomalies") or []]


def why_flagged(package: Mapping[str, Any]) -> None:
    """The warning panel: each anomaly kind with the sentence saying what made it fire."""
    found = reasons(package)
    if not found:
        return
    lines = []
    for a in found:
        why = a["reason"].get("sentence") or "flagged (export the package again to see why)"
        other = a["reason"].get("other_handoff_id")
        link = f" · [open {_ui.user_text(other, 200)}]({_ui.explorer_link(other)})" if other else ""
        lines.append(f"- **{_ui.user_text(a['kind'])}**: {_ui.user_text(why, 600)}{link}")
    st.warning(
        "**Why flagged**\n\n"
        + "\n".join(lines)
        + "\n\nThe integrity check says the rows are unaltered; it does not say the handoff "
        "is healthy.",
        icon=":material/flag:",
    )


def _stored_flag(attrs: Mapping[str, Any], name: str) -> str:
    v = attrs.get(name)
    return _ui.DASH if v is None else str(v)


def transitions_frame(package: Mapping[str, Any]) -> pd.DataFrame:
    """The transitions table: `legal` (the state machine's verdict, was `valid`), the
    evidence flag and count as stored on the row, and `flagged` naming the kinds whose
    reason points at the row."""
    tdf = pd.DataFrame(package.get("transitions") or [])
    if tdf.empty:
        return tdf
    by_span: dict[str, list[str]] = {}
    for a in reasons(package):
        span = a["reason"].get("transition_span_id")
        if span:
            by_span.setdefault(str(span), []).append(str(a["kind"]))
    attrs = [t.get("attributes") or {} for t in package.get("transitions") or []]
    tdf["evidence_valid"] = [_stored_flag(a, "handoff.evidence.valid") for a in attrs]
    tdf["evidence_count"] = [_stored_flag(a, "handoff.evidence.count") for a in attrs]
    tdf["flagged"] = [
        "⚠ " + ", ".join(by_span[s]) if s in by_span else "" for s in tdf.get("span_id", [])
    ]
    # the handoff's own ids are in the header; time_ns would overflow a JS number
    tdf = tdf.drop(columns=[c for c in ("time_ns", "tenant", "task_id", "handoff_id") if c in tdf])
    tdf = tdf.rename(columns={"valid": "legal"})
    # arrivals: how often the same span was stored (a transport resend, counted once)
    cols = (
        "flagged",
        "event",
        "from_state",
        "to_state",
        "actor",
        "time",
        "legal",
        "evidence_valid",
        "evidence_count",
        "arrivals",
    )
    first = [c for c in cols if c in tdf]
    return tdf[first + [c for c in tdf if c not in first]]


def evidence_refs_frame(package: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (evidence reference, transition carrying it): the reference, the
    transition, its span and its handoff.evidence.valid as stored ("—" when absent)."""
    out = []
    for t in package.get("transitions") or []:
        attrs = t.get("attributes") or {}
        try:
            refs = json.loads(attrs.get("handoff.evidence_refs") or "[]")
        except ValueError:
            refs = []
        for ref in refs if isinstance(refs, list) else []:
            out.append(
                {
                    "evidence_ref": str(ref),
                    "carried by": f"{t.get('event')} at {t.get('time')}",
                    "span_id": t.get("span_id"),
                    "evidence.valid (as stored)": _stored_flag(attrs, "handoff.evidence.valid"),
                }
            )
    if not out:  # refs the package lists but no transition attribute carries (older package)
        out = [{"evidence_ref": str(r)} for r in package.get("evidence_refs") or []]
    return pd.DataFrame(out)


def id_table(df: pd.DataFrame, *, key: str, current: str | None = None) -> None:
    """Handoffs by whole id (the column as wide as the longest), each linking into the
    Explorer; `current` marked. Other columns as given."""
    view = df.copy()
    ids = [str(h) for h in view.pop("handoff_id")]
    view.insert(0, "handoff", [_ui.explorer_link(h) for h in ids])
    if current is not None:
        view.insert(0, "", ["◉" if h == current else "" for h in ids])
    width = _PAD_PX + _CHAR_PX * max((len(h) for h in ids), default=10)
    config: dict[str, Any] = {
        "handoff": st.column_config.LinkColumn(
            "handoff", display_text=r"explorer\?handoff_id=(.*)", width=width
        )
    }
    if "created" in view:
        config["created"] = st.column_config.DatetimeColumn(
            "created (UTC)", format="YYYY-MM-DD HH:mm:ss"
        )
    st.dataframe(view, hide_index=True, key=key, column_config=config)


def ids_text(ids: Sequence[str]) -> str:
    """The ids, one a line, for a code block to copy."""
    return "\n".join(str(i) for i in ids)
