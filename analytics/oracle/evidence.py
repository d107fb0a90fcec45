"""The evidence checks in plain Python over transition rows: the oracle the SQL of the checks
(analytics/_sql/evidence_facts.py) and of the `evidence` anomaly pass is tested against, and
what analytics.oracle.funnel reads for V(h) (a result counts as evidenced only when the emitter
marked it valid and these checks pass).

Rows as in analytics.oracle.funnel, plus `attributes` (the map as stored: ints as decimal text,
bools as true/false, string[] as JSON text) and optionally `evidence_refs` (the typed column;
read from the attribute when absent). Written from docs/metrics.md ("Evidence checks"),
reading only collector.contract and collector.semconv: no SQL, no shared helper with it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from collector import semconv as sc
from collector.contract import EXECUTED, RESULT_EVENTS, STATE_RANK, State, is_legal

__all__ = [
    "EVIDENCE_KINDS",
    "EvidenceCheck",
    "Policy",
    "below",
    "check",
    "evidence_anomalies",
    "first_results",
    "kinds",
    "outside",
    "policy",
    "refs",
    "results",
    "returned",
    "time_ns",
]

#: the kinds evidence_anomalies computes, in the report's order (docs/metrics.md)
EVIDENCE_KINDS: Final = (
    "evidence_out_of_window",
    "evidence_below_policy",
    "reply_contract_unmet",
    "evidence_claim_disputed",
)
_ISO: Final = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T")
_INT: Final = re.compile(r"^-?[0-9]+$")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
Row = Mapping[str, Any]


def time_ns(text: Any) -> int | None:
    """An ISO-8601 time (date, `T`, time; `Z`, an offset, or none = UTC) as ns since the
    epoch; None when empty or not such a time."""
    if not isinstance(text, str) or not _ISO.match(text):
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def _attrs(r: Row) -> Mapping[str, str]:
    return r.get("attributes") or {}


def _strings(text: Any) -> list[str]:
    """A stored string[] attribute (JSON text) as its strings ("" for any other item)."""
    try:
        v = json.loads(text) if isinstance(text, str) and text else []
    except ValueError:
        return []
    return [x if isinstance(x, str) else "" for x in v] if isinstance(v, list) else []


def _counted(r: Row) -> bool:
    return bool(r.get("valid", True)) and is_legal(
        r["from_state"] or None, r["event"], r["to_state"]
    )


def _is_create(r: Row) -> bool:
    return (
        bool(r.get("valid", True))
        and r["event"] == "create"
        and not r["from_state"]
        and r["to_state"] == "created"
    )


def _order(r: Row) -> tuple[int, int]:
    fr = STATE_RANK[State(r["from_state"])] + 1 if r["from_state"] else 0
    return fr, STATE_RANK[State(r["to_state"])]


@dataclass(frozen=True, slots=True)
class Policy:
    """The checks a handoff's envelope declares (times in ns; None / False / () = not
    declared). `must_return` is None when the envelope names no reply contract fields."""

    valid_after_ns: int | None
    valid_before_ns: int | None
    min_refs: int | None
    require_claims: bool
    must_return: tuple[str, ...] | None

    @property
    def windowed(self) -> bool:
        return self.valid_after_ns is not None or self.valid_before_ns is not None


@dataclass(frozen=True, slots=True)
class EvidenceCheck:
    """Which declared check the handoff's result fails (docs/metrics.md)."""

    out_of_window: bool
    below_policy: bool
    contract_unmet: bool

    @property
    def failed(self) -> bool:
        return self.out_of_window or self.below_policy or self.contract_unmet


def policy(rows: Iterable[Row]) -> Policy:
    """The policy of a handoff's counted create rows: each value the greatest over them
    (must_return: the greatest stored text among the rows carrying it, then read)."""
    cr = [r for r in rows if _is_create(r)]

    def most(values: Iterable[int | None]) -> int | None:
        got = [v for v in values if v is not None]
        return max(got) if got else None

    mins = [_attrs(r).get(sc.EVIDENCE_POLICY_MIN_REFS) for r in cr]
    must = [
        _attrs(r)[sc.REPLY_CONTRACT_MUST_RETURN]
        for r in cr
        if sc.REPLY_CONTRACT_MUST_RETURN in _attrs(r)
    ]
    return Policy(
        valid_after_ns=most(time_ns(_attrs(r).get(sc.EVIDENCE_POLICY_VALID_AFTER)) for r in cr),
        valid_before_ns=most(time_ns(_attrs(r).get(sc.EVIDENCE_POLICY_VALID_BEFORE)) for r in cr),
        min_refs=most(int(m) if isinstance(m, str) and _INT.match(m) else None for m in mins),
        require_claims=any(_attrs(r).get(sc.EVIDENCE_POLICY_REQUIRE_CLAIMS) == "true" for r in cr),
        must_return=tuple(_strings(max(must))) if must else None,
    )


def refs(r: Row) -> list[str]:
    """A result row's evidence ref ids: the typed column, else the attribute."""
    ids = r.get("evidence_refs")
    return [str(x) for x in ids] if ids is not None else _strings(_attrs(r).get(sc.EVIDENCE_REFS))


def outside(p: Policy, r: Row) -> int | None:
    """The index of the first ref of result row r whose valid_at (aligned by index) is
    missing, not a time, or outside [valid_after, valid_before); None when every ref's is
    inside (or no window is declared)."""
    if not p.windowed:
        return None
    at = _strings(_attrs(r).get(sc.EVIDENCE_VALID_AT))
    for i in range(len(refs(r))):
        t = time_ns(at[i]) if i < len(at) else None
        if t is None:
            return i
        if p.valid_after_ns is not None and t < p.valid_after_ns:
            return i
        if p.valid_before_ns is not None and t >= p.valid_before_ns:
            return i
    return None


def below(p: Policy, r: Row) -> str | None:
    """What result row r lacks against the policy: "min_refs" (fewer distinct non-empty ref
    ids), "claims" (a ref without a claim, aligned by index, where claims are required), or
    None."""
    ids = refs(r)
    if p.min_refs is not None and len({x for x in ids if x}) < p.min_refs:
        return "min_refs"
    claims = _strings(_attrs(r).get(sc.EVIDENCE_CLAIMS))
    if p.require_claims and any(i >= len(claims) or claims[i] == "" for i in range(len(ids))):
        return "claims"
    return None


def results(rows: Iterable[Row]) -> list[Row]:
    """The counted result rows (prepare, commit, resolve_committed)."""
    return [r for r in rows if _counted(r) and r["event"] in RESULT_EVENTS]


def first_results(rows: Iterable[Row]) -> list[Row]:
    """The rows of the first result transition in machine order (copies and re-emissions
    of it included): the result V(h) reads and the evidence checks judge."""
    res = results(rows)
    if not res:
        return []
    first = min(_order(r) for r in res)
    return [r for r in res if _order(r) == first]


def returned(rows: Iterable[Row]) -> set[str]:
    """The field names the counted result rows returned (result.fields, their union)."""
    return {f for r in results(rows) for f in _strings(_attrs(r).get(sc.RESULT_FIELDS))}


def check(rows: Sequence[Row]) -> EvidenceCheck:
    """The checks of one handoff's stored rows (copies included: each check is an any()
    over rows or a union, so a copy changes nothing). No check declared: none fails."""
    p = policy(rows)
    first_rows = first_results(rows)
    return EvidenceCheck(
        out_of_window=any(outside(p, r) is not None for r in first_rows),
        below_policy=any(below(p, r) is not None for r in first_rows),
        contract_unmet=p.must_return is not None and not set(p.must_return) <= returned(rows),
    )


def _claimed(rows: Sequence[Row]) -> bool:
    """The emitter's claim V(h) reads: the first result transition's rows all carry
    evidence.count >= 1 and evidence.valid = true (and the handoff executed)."""
    c = [r for r in rows if _counted(r)]
    reached = {r["to_state"] for r in c} | {r["from_state"] for r in c if r["from_state"]}
    if not reached & set(EXECUTED):
        return False
    first = first_results(c)
    return bool(first) and all(
        (r.get("evidence_count") or 0) >= 1 and r.get("evidence_valid") is True for r in first
    )


def kinds(rows: Sequence[Row]) -> list[str]:
    """EVIDENCE_KINDS one handoff's stored rows show (sorted; window-free)."""
    c = check(rows)
    committed = any(
        _counted(r) and {"committed", "verified"} & {r["to_state"], r["from_state"]} for r in rows
    )
    found = {
        "evidence_out_of_window": c.out_of_window,
        "evidence_below_policy": c.below_policy,
        "reply_contract_unmet": c.contract_unmet and committed,
        "evidence_claim_disputed": c.failed and _claimed(rows),
    }
    return sorted(k for k, v in found.items() if v)


def evidence_anomalies(
    rows: Iterable[Row], *, start_ns: int, end_ns: int
) -> dict[tuple[str, str], list[str]]:
    """EVIDENCE_KINDS of the cohort (handoffs whose first counted create is in [start_ns,
    end_ns)), from all stored rows: {(tenant, handoff_id): sorted kinds}, a handoff with
    none left out."""
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), str(r["handoff_id"]))].append(r)
    out: dict[tuple[str, str], list[str]] = {}
    for key, hr in by_h.items():
        created = [int(r["time_ns"]) for r in hr if _is_create(r)]
        if created and start_ns <= min(created) < end_ns and (found := kinds(hr)):
            out[key] = found
    return out
