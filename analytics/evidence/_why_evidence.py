"""Why an evidence check failed: the result row, the field and its stored value behind each
evidence kind (and behind committed_without_evidence when the emitter's claim was
disputed), as analytics.evidence._why states the other kinds. Pure; the verdicts are
analytics.oracle.evidence's, a reason only explains one.

`why(kind, rows)` -> (row, sentence, field, value) or None when the rows do not show it;
the sentence reads after the kind and names the row by `step(row)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from analytics.oracle import evidence as ev
from collector import semconv as sc

__all__ = ["KINDS", "why"]

Row = Mapping[str, Any]
#: (row, sentence after "{step of row}", field, value)
Found = tuple[Row, str, str, str]
ABSENT: Final = "(absent)"


def _attr(r: Row, name: str) -> str:
    return str((r.get("attributes") or {}).get(name, ABSENT))


def _iso(t_ns: int | None) -> str:
    if t_ns is None:
        return "…"
    sec, frac = divmod(t_ns, 1_000_000_000)
    base = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return base + (f".{frac // 1000:06d}Z" if frac else "Z")


def _earliest(r: Row) -> tuple[int, str]:
    return int(r["time_ns"]), str(r.get("span_id", ""))


def out_of_window(rows: Sequence[Row]) -> Found | None:
    p = ev.policy(rows)
    hits = [(r, i) for r in ev.first_results(rows) if (i := ev.outside(p, r)) is not None]
    if not hits:
        return None
    r, i = min(hits, key=lambda h: _earliest(h[0]))
    ref = ev.refs(r)[i]
    window = f"[{_iso(p.valid_after_ns)}, {_iso(p.valid_before_ns)})"
    value = _attr(r, sc.EVIDENCE_VALID_AT)
    texts = ev._strings((r.get("attributes") or {}).get(sc.EVIDENCE_VALID_AT))
    text = texts[i] if i < len(texts) else ""
    t = ev.time_ns(text)
    if t is None:
        at = f"with no valid_at that reads as a time ({text!r})" if text else "without a valid_at"
        why = f"cites {ref!r} {at}, where the evidence policy's window is {window}"
    elif p.valid_after_ns is not None and t < p.valid_after_ns:
        why = (
            f"cites {ref!r} with valid_at {text}, before the evidence policy's valid_after "
            f"{_iso(p.valid_after_ns)} (its window {window})"
        )
    else:
        why = (
            f"cites {ref!r} with valid_at {text}, at or after the evidence policy's "
            f"valid_before {_iso(p.valid_before_ns)} (exclusive; its window {window})"
        )
    return r, why, sc.EVIDENCE_VALID_AT, value


def below_policy(rows: Sequence[Row]) -> Found | None:
    p = ev.policy(rows)
    hits = [(r, what) for r in ev.first_results(rows) if (what := ev.below(p, r)) is not None]
    if not hits:
        return None
    r, what = min(hits, key=lambda h: _earliest(h[0]))
    if what == "min_refs":
        n = len({x for x in ev.refs(r) if x})
        sentence = (
            f"cites {n} distinct evidence refs, fewer than the policy's min_refs {p.min_refs}"
        )
        return r, sentence, sc.EVIDENCE_REFS, _attr(r, sc.EVIDENCE_REFS)
    ids = ev.refs(r)
    claims = ev._strings((r.get("attributes") or {}).get(sc.EVIDENCE_CLAIMS))
    bare = next((x for i, x in enumerate(ids) if i >= len(claims) or claims[i] == ""), "")
    sentence = f"cites {bare!r} without a claim, where the policy requires claims"
    return r, sentence, sc.EVIDENCE_CLAIMS, _attr(r, sc.EVIDENCE_CLAIMS)


def contract_unmet(rows: Sequence[Row]) -> Found | None:
    must = ev.policy(rows).must_return
    last = max(ev.results(rows), key=_earliest, default=None)
    if must is None or last is None:
        return None
    missing = [f for f in must if f not in ev.returned(rows)]
    if not missing:
        return None
    sentence = (
        f"ends the results, none of which returned {', '.join(missing)} (named by the "
        "reply contract's must_return)"
    )
    return last, sentence, sc.RESULT_FIELDS, _attr(last, sc.RESULT_FIELDS)


def disputed(rows: Sequence[Row]) -> Found | None:
    """The failed check behind a claim: the first of the three that explains it."""
    for check in (out_of_window, below_policy, contract_unmet):
        found = check(rows)
        if found is not None:
            r, sentence, field, value = found
            return r, f"{sentence}, while the first result marked its evidence valid", field, value
    return None


#: kind -> its explanation
KINDS: Final[dict[str, Callable[[Sequence[Row]], Found | None]]] = {
    "evidence_out_of_window": out_of_window,
    "evidence_below_policy": below_policy,
    "reply_contract_unmet": contract_unmet,
    "evidence_claim_disputed": disputed,
}


def why(kind: str, rows: Sequence[Row]) -> Found | None:
    """The explanation of `kind` (KINDS, or committed_without_evidence whose claim an
    evidence check disputes), or None."""
    fn = disputed if kind == "committed_without_evidence" else KINDS.get(kind)
    return None if fn is None else fn(rows)
