"""Why a handoff was flagged: one sentence per anomaly kind naming the field of the transition
(or the other handoff) that made it fire (pure; definitions: docs/metrics.md).

Each kind's function takes the handoff's rows (mappings with the handoff_transitions column
names, `time_ns` in ns, the attribute map as stored: an evidence package's proven rows or
transitions) and returns a `Reason`, or None when the rows do not show the kind. The
cross-handoff kinds take the task's rows too (`bounce`, `stale_fence`: analytics.oracle.funnel
task_anomalies' reading) or the conflicting create (`idempotency_conflict`). The sentences
follow analytics.oracle.funnel and analytics.oracle.audit, which decide the kinds; a reason
explains a verdict, it never makes one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from analytics.evidence import _why_evidence as why_evidence
from analytics.oracle import funnel as ref
from analytics.oracle.audit import is_create
from analytics.oracle.audit import iso_ns as parse_time
from collector import semconv as sc
from collector.contract import (
    ACCEPTED_OR_LATER,
    RESULT_EVENTS,
    STATE_RANK,
    TERMINAL,
    State,
    reachable_from,
)

__all__ = ["ROW_KINDS", "Reason", "handoff_reasons", "reason_dicts"]

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Reason:
    """Why `kind` fired: `sentence` (reads after the kind, e.g. "the commit at ... carries
    handoff.evidence.valid = false"), the transition it points at (`transition_span_id`),
    the other handoff involved (`other_handoff_id`), and the `field` with its stored `value`
    ("(absent)" when the attribute is missing). Empty strings where none applies."""

    kind: str
    sentence: str
    transition_span_id: str = ""
    other_handoff_id: str = ""
    field: str = ""
    value: str = ""

    def as_dict(self) -> dict[str, str]:
        """The package's `reason` object (every field, kind included)."""
        return asdict(self)


ABSENT: Final = "(absent)"
_RECEIVER_EVENTS: Final = frozenset({"accept", "reject", "start", "prepare", "commit", "fail"})
_GRANT_USE_EVENTS: Final = frozenset({"start", "prepare", "commit"})


def _when(t_ns: int) -> str:
    """UTC time to the millisecond when it has a fraction, e.g. 2026-12-05T10:01:02.500Z."""
    sec, frac = divmod(int(t_ns), 1_000_000_000)
    base = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return base + (f".{frac // 1_000_000:03d}Z" if frac else "Z")


def _secs(d_ns: int) -> str:
    s = abs(d_ns) / 1e9
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _attr(r: Row, name: str) -> str:
    return str((r.get("attributes") or {}).get(name, ABSENT))


def _step(r: Row) -> str:
    """'the commit (prepared → committed) at T (span S)'."""
    move = f"{r['from_state'] or 'none'} → {r['to_state']}"
    return f"the {r['event']} ({move}) at {_when(r['time_ns'])} (span {r.get('span_id', '')})"


def _first(rows: Iterable[Row]) -> Row | None:
    return min(rows, key=lambda r: (int(r["time_ns"]), str(r.get("span_id", ""))), default=None)


def _rank(r: Row) -> tuple[int, int]:
    try:
        fr = STATE_RANK[State(r["from_state"])] + 1 if r["from_state"] else 0
        return fr, STATE_RANK[State(r["to_state"])]
    except ValueError:
        return 99, 99


def _span(kind: str, r: Row, sentence: str, field: str, value: str) -> Reason:
    return Reason(
        kind, sentence, transition_span_id=str(r.get("span_id", "")), field=field, value=value
    )


# ---------------------------------------------------------------- one handoff's own rows


def committed_without_evidence(rows: Sequence[Row]) -> Reason | None:
    """The first result row (prepare, commit, resolve_committed) whose evidence is not valid
    with count >= 1: the one that left the handoff without evidence (the contract reads the
    earliest result step only)."""
    kind = "committed_without_evidence"
    c = [r for r in rows if ref.counted(r)]
    if not {r["to_state"] for r in c} & {"committed", "verified"}:
        return None
    results = [r for r in c if r["event"] in RESULT_EVENTS]
    if not results:
        into = _first(r for r in c if r["to_state"] in ("committed", "verified")) or c[-1]
        return _span(
            kind,
            into,
            f"{_step(into)} reached {into['to_state']} with no prepare, "
            "commit or resolve_committed row to carry evidence",
            "event",
            str(into["event"]),
        )
    step = min(_rank(r) for r in results)
    bad = [r for r in results if _rank(r) == step and not _evidence_ok(r)]
    r = _first(bad)
    if r is None:  # the claim held, and an evidence check disputes it
        return _evidence_reason(kind, rows)
    if r.get("evidence_valid") is not True:
        name, value = sc.EVIDENCE_VALID, _attr(r, sc.EVIDENCE_VALID)
    else:
        name, value = sc.EVIDENCE_COUNT, _attr(r, sc.EVIDENCE_COUNT)
    return _span(kind, r, f"{_step(r)} carries {name} = {value}", name, value)


def _evidence_reason(kind: str, rows: Sequence[Row]) -> Reason | None:
    """An evidence check's reason (analytics.evidence._why_evidence) as a Reason of `kind`."""
    found = why_evidence.why(kind, rows)
    if found is None:
        return None
    r, sentence, field, value = found
    return _span(kind, r, f"{_step(r)} {sentence}", field, value)


def _evidence_ok(r: Row) -> bool:
    return (r.get("evidence_count") or 0) >= 1 and r.get("evidence_valid") is True


def invalid_transition(rows: Sequence[Row]) -> Reason | None:
    """A row that does not count (illegal, or handoff.valid = false), else two moves out of
    one state, else a move out of a state the handoff's terminal state is not reachable from."""
    kind = "invalid_transition"
    for r in rows:
        if not ref.counted(r):
            if not r.get("valid", True):
                return _span(
                    kind, r, f"{_step(r)} carries {sc.VALID} = false", sc.VALID, _attr(r, sc.VALID)
                )
            return _span(
                kind,
                r,
                f"{_step(r)} is not a legal move of the state machine",
                "event",
                str(r["event"]),
            )
    c = [r for r in rows if ref.counted(r)]
    outs: dict[str, list[Row]] = defaultdict(list)
    for r in c:
        if r["from_state"] and all(
            (o["event"], o["to_state"]) != (r["event"], r["to_state"])
            for o in outs[r["from_state"]]
        ):
            outs[r["from_state"]].append(r)
    for state, moves in outs.items():
        if len(moves) > 1:
            a, b = moves[0], moves[1]
            return _span(
                kind,
                b,
                f"two moves out of {state}: {_step(a)} and {_step(b)}",
                "event",
                str(b["event"]),
            )
    for end in [r for r in c if r["to_state"] in TERMINAL and r["to_state"] != "committed"]:
        for r in c:
            if (
                r is not end
                and r["from_state"]
                and end["to_state"] not in reachable_from(r["from_state"])
            ):
                return _span(
                    kind,
                    r,
                    f"{_step(r)} moves on after the handoff reached {end['to_state']}",
                    "from_state",
                    str(r["from_state"]),
                )
    return None


def duplicate_delivery(rows: Sequence[Row]) -> Reason | None:
    """A transition stored as two different spans (or one span id at two times)."""
    by: dict[tuple[str, str, str], dict[tuple[str, str, int], Row]] = defaultdict(dict)
    for r in rows:
        by[(r["event"], r["from_state"], r["to_state"])].setdefault(ref.copy_key(r), r)
    for copies in by.values():
        if len(copies) > 1:
            a, b = sorted(copies.values(), key=lambda r: (int(r["time_ns"]), str(r["span_id"])))[:2]
            return _span(
                "duplicate_delivery",
                b,
                f"{_step(b)} repeats {_step(a)}: one transition delivered twice",
                "span_id",
                str(b["span_id"]),
            )
    return None


def clock_skew(rows: Sequence[Row]) -> Reason | None:
    """A counted transition timestamped before the transition it must follow."""
    c = [r for r in rows if ref.counted(r)]
    for a in c:
        for b in c:
            if (
                b["from_state"] == a["to_state"]
                and b["to_state"] != a["from_state"]
                and _rank(a) < _rank(b)
                and int(b["time_ns"]) < int(a["time_ns"])
            ):
                d = _secs(int(a["time_ns"]) - int(b["time_ns"]))
                return _span(
                    "clock_skew",
                    b,
                    f"{_step(b)} is timestamped {d} before {_step(a)}, which it follows",
                    "time",
                    _when(b["time_ns"]),
                )
    return None


def unknown_unresolved(
    rows: Sequence[Row], *, as_of_ns: int, unknown_sla_ms: int = ref.UNKNOWN_SLA_MS
) -> Reason | None:
    """The first entry into unknown, never left, older than the SLA at `as_of_ns`."""
    c = [r for r in rows if ref.counted(r)]
    into = _first(r for r in c if r["to_state"] == "unknown")
    if into is None or any(r["from_state"] == "unknown" for r in c):
        return None
    age = as_of_ns - int(into["time_ns"])
    return _span(
        "unknown_unresolved",
        into,
        f"{_step(into)} was never resolved: "
        f"{_secs(age)} in unknown at {_when(as_of_ns)}, over the "
        f"{unknown_sla_ms / 60_000:g} min SLA",
        "to_state",
        "unknown",
    )


def accepted_never_started(rows: Sequence[Row], *, as_of_ns: int) -> Reason | None:
    """The acceptance, with the deadline that passed without a start."""
    c = [r for r in rows if ref.counted(r)]
    acc = _first(r for r in c if r["to_state"] in ACCEPTED_OR_LATER)
    f = ref.facts(str(rows[0]["handoff_id"]), rows, as_of_ns=as_of_ns) if rows else None
    if acc is None or f is None or f.created_ns is None:
        return None
    due = f.created_ns + f.deadline_ms * 1_000_000
    return _span(
        "accepted_never_started",
        acc,
        f"{_step(acc)} was never followed by a start: "
        f"the deadline of {f.deadline_ms} ms passed at {_when(due)}",
        sc.DEADLINE_MS,
        str(f.deadline_ms),
    )


def implied_accept(rows: Sequence[Row]) -> Reason | None:
    """The first counted move past created without an accept row before it."""
    c = [r for r in rows if ref.counted(r)]
    past = sorted((r for r in c if r["from_state"] in ACCEPTED_OR_LATER), key=_rank)
    r = past[0] if past else None
    if r is None:
        return None
    return _span(
        "implied_accept",
        r,
        f"{_step(r)} leaves {r['from_state']}, but no accept row was stored",
        "event",
        str(r["event"]),
    )


def orphan_transition(rows: Sequence[Row]) -> Reason | None:
    """The first stored row of a handoff without a counted create."""
    r = _first(rows)
    if r is None:
        return None
    return _span(
        "orphan_transition",
        r,
        f"no create was stored: the first row is {_step(r)}",
        "event",
        str(r["event"]),
    )


def _envelope(rows: Sequence[Row]) -> Row | None:
    return _first(r for r in rows if is_create(r))


def wrong_consumer(rows: Sequence[Row]) -> Reason | None:
    """A receiver's row whose actor is not the envelope's to_agent."""
    env = _envelope(rows)
    to = str((env or {}).get("to_agent") or "")
    bad = _first(r for r in rows if to and r["event"] in _RECEIVER_EVENTS and r["actor"] != to)
    if bad is None:
        return None
    return _span(
        "wrong_consumer",
        bad,
        f"{_step(bad)} was made by {bad['actor']}, not the envelope's to_agent {to}",
        "actor",
        str(bad["actor"]),
    )


def grant_expired(rows: Sequence[Row]) -> Reason | None:
    """The last start, prepare or commit after the grant's expiry."""
    env = _envelope(rows)
    text = _attr(env, sc.GRANT_EXPIRES_AT) if env else ABSENT
    exp = parse_time(text if text != ABSENT else "")
    uses = [r for r in rows if r["event"] in _GRANT_USE_EVENTS]
    last = max(uses, key=lambda r: int(r["time_ns"]), default=None)
    if exp is None or last is None or int(last["time_ns"]) <= exp:
        return None
    return _span(
        "grant_expired",
        last,
        f"{_step(last)} uses the grant "
        f"{_secs(int(last['time_ns']) - exp)} after {sc.GRANT_EXPIRES_AT} = {text}",
        sc.GRANT_EXPIRES_AT,
        text,
    )


def capability_outside_grant(rows: Sequence[Row]) -> Reason | None:
    """The create asking for capabilities the grant does not list."""
    env = _envelope(rows)
    if env is None or sc.GRANT_CAPABILITIES not in (env.get("attributes") or {}):
        return None
    granted = _attr(env, sc.GRANT_CAPABILITIES)
    try:
        allowed = json.loads(granted)
    except ValueError:
        allowed = []
    allowed = {str(x) for x in allowed} if isinstance(allowed, list) else set()
    outside = [c for c in env.get("capabilities") or () if c not in allowed]
    if not outside:
        return None
    return _span(
        "capability_outside_grant",
        env,
        f"{_step(env)} asks for {', '.join(outside)}, outside {sc.GRANT_CAPABILITIES} = {granted}",
        "handoff.capabilities",
        json.dumps(outside),
    )


def grant_tenant_mismatch(rows: Sequence[Row]) -> Reason | None:
    """The create whose grant names another tenant than the one the handoff is stored in."""
    env = _envelope(rows)
    g = _attr(env, sc.GRANT_TENANT) if env else ABSENT
    if env is None or g in (ABSENT, "", env["tenant"]):
        return None
    return _span(
        "grant_tenant_mismatch",
        env,
        f"{_step(env)} carries {sc.GRANT_TENANT} = {g}; "
        f"the handoff is stored under tenant {env['tenant']}",
        sc.GRANT_TENANT,
        g,
    )


def tenant_claim_mismatch(rows: Sequence[Row]) -> Reason | None:
    """A row claiming another tenant than the one it is stored under."""
    r = _first(x for x in rows if (x.get("claimed_tenant") or "") not in ("", x["tenant"]))
    if r is None:
        return None
    return _span(
        "tenant_claim_mismatch",
        r,
        f"{_step(r)} claims tenant {r['claimed_tenant']}; it is stored under tenant {r['tenant']}",
        "handoff.tenant",
        str(r["claimed_tenant"]),
    )


#: the kinds explained from the handoff's own rows alone
_OWN: Final[dict[str, Callable[[Sequence[Row]], Reason | None]]] = {
    "committed_without_evidence": committed_without_evidence,
    "invalid_transition": invalid_transition,
    "duplicate_delivery": duplicate_delivery,
    "clock_skew": clock_skew,
    "implied_accept": implied_accept,
    "orphan_transition": orphan_transition,
    "wrong_consumer": wrong_consumer,
    "grant_expired": grant_expired,
    "capability_outside_grant": capability_outside_grant,
    "grant_tenant_mismatch": grant_tenant_mismatch,
    "tenant_claim_mismatch": tenant_claim_mismatch,
    **{k: partial(_evidence_reason, k) for k in why_evidence.KINDS},
}
#: every kind an evidence package explains from its own rows (the rest: _why_task)
ROW_KINDS: Final = frozenset({*_OWN, "unknown_unresolved", "accepted_never_started"})


def handoff_reasons(kinds: Iterable[str], rows: Sequence[Row], *, as_of_ns: int) -> list[Reason]:
    """A Reason per kind in `kinds` that ROW_KINDS holds, in the order given. A kind the rows
    do not explain (they should, whenever the kind was computed from them) gets a sentence
    saying so rather than none."""
    out = []
    for kind in kinds:
        if kind not in ROW_KINDS:
            continue
        if kind == "unknown_unresolved":
            got = unknown_unresolved(rows, as_of_ns=as_of_ns)
        elif kind == "accepted_never_started":
            got = accepted_never_started(rows, as_of_ns=as_of_ns)
        else:
            got = _OWN[kind](rows)
        out.append(got or Reason(kind, "flagged; no single transition of it explains why"))
    return out


#: the sentence of a kind without a reason (as handoff-evidence/v2 packages have it)
NO_REASON: Final = "flagged; this package cannot say why (needs the task's other handoffs)"


def reason_dicts(
    kinds: Sequence[str],
    reasons: Iterable[Reason | Mapping[str, Any]],
    *,
    fallback: str | None = None,
) -> list[dict[str, Any]]:
    """The package's `anomaly_reasons`: [{"kind", "reason": {...}}] for each of `kinds` (its
    order), from Reasons or reason dicts; a kind without one gets a reason saying so
    (`fallback`, default NO_REASON)."""
    by: dict[str, dict[str, Any]] = {}
    for r in reasons:
        d = r.as_dict() if isinstance(r, Reason) else dict(r)
        by.setdefault(str(d.get("kind")), d)
    out = []
    for k in kinds:
        d = by.get(k) or Reason(k, fallback or NO_REASON).as_dict()
        out.append({"kind": k, "reason": d})
    return out
