"""The metric contract in plain Python over transition rows: the oracle the SQL is tested
against, and the per-handoff part of evidence packages (no database needed).

Written from docs/design.md "Metric contract" and docs/metrics.md, reading only
collector/contract.py: no bit masks, no SQL. Rows are mappings with the handoff_transitions
column names (`time_ns` as integer nanoseconds instead of `time`).

Copies: rows of one handoff with the same transition, span ids and time (copy_key) are one
span stored again (an exporter retrying a request, a collector re-sending a batch): not a
duplicate delivery. Every other fact folds rows idempotently (sets, minima, all()), so a
copy changes no number. The same transition as another span (an agent re-emitting it), or
one span id at two times, is a duplicate delivery. One span id carrying another transition
is not a resend either: both transitions count, as any two would, and the state machine
judges them (two moves out of one state are invalid_transition).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from analytics.oracle.evidence import check as evidence_check
from analytics.oracle.evidence import kinds as evidence_kinds
from collector.contract import (
    ACCEPTED_OR_LATER,
    EXECUTED,
    RESULT_EVENTS,
    STATE_RANK,
    TERMINAL,
    State,
    is_legal,
    reachable_from,
)
from collector.semconv import DEFAULT_DEADLINE_MS, SETTLE_GRACE_MS

__all__ = [
    "UNKNOWN_SLA_MS",
    "HandoffFacts",
    "copy_key",
    "counted",
    "facts",
    "funnel_counts",
    "handoff_anomalies",
    "machine_order",
    "task_anomalies",
]

#: Default SLA after which an unresolved `unknown` is an anomaly (15 minutes).
UNKNOWN_SLA_MS: Final = 15 * 60 * 1000
Row = Mapping[str, Any]


def _key(from_state: str, to_state: str) -> tuple[int, int]:
    fr = STATE_RANK[State(from_state)] + 1 if from_state else 0
    return fr, STATE_RANK[State(to_state)]


def copy_key(row: Row) -> tuple[str, str, int]:
    """What makes two stored rows of one handoff and transition one span stored again:
    equal (trace_id, span_id, time_ns); a missing id compares as empty. The attribute map is
    not compared (see analytics._sql.anomalies.COPY_KEY, the same in SQL)."""
    return (str(row.get("trace_id") or ""), str(row.get("span_id") or ""), int(row["time_ns"]))


def counted(row: Row) -> bool:
    """A row counts for the metrics when legal under the table and not flagged invalid."""
    return bool(row.get("valid", True)) and is_legal(
        row["from_state"] or None, row["event"], row["to_state"]
    )


def machine_order(rows: Iterable[Row]) -> list[Row]:
    """Rows sorted by machine order (rank of from, rank of to), then time, then span_id.

    Rows whose states are not in the contract sort last (in time order)."""

    def k(r: Row) -> tuple[int, int, int, str]:
        try:
            mk = _key(r["from_state"], r["to_state"])
        except ValueError:
            mk = (99, 99)
        return (*mk, int(r["time_ns"]), str(r.get("span_id", "")))

    return sorted(rows, key=k)


@dataclass(frozen=True, slots=True)
class HandoffFacts:
    """The contract's view of one handoff (times in ns since the epoch, None when unseen)."""

    handoff_id: str
    created_ns: int | None
    deadline_ms: int
    mode: str
    reached: frozenset[str]
    settled: bool
    a: bool
    e: bool
    v: bool  # v_claimed, and the evidence checks the envelope declares pass
    k: bool
    unk: bool
    unresolved: bool
    esc: bool
    rejected: bool
    accept_seen: bool
    t_unknown_in: int | None
    v_claimed: bool  # E, and the first result's evidence marked valid by the emitter


def facts(handoff_id: str, rows: Sequence[Row], *, as_of_ns: int) -> HandoffFacts:
    """Evaluate the metric contract for one handoff's stored rows (copies included: a
    resent span changes nothing, as every fact is a set, a minimum or an all())."""
    c = [r for r in rows if counted(r)]
    creates = [r for r in c if r["event"] == "create"]
    created = min((int(r["time_ns"]) for r in creates), default=None)
    deadlines = [int(r["deadline_ms"]) for r in creates if r.get("deadline_ms") is not None]
    deadline: int = max(deadlines) if deadlines else DEFAULT_DEADLINE_MS
    mode = max((r.get("mode") or "" for r in creates), default="")
    reached = {r["to_state"] for r in c} | {r["from_state"] for r in c if r["from_state"]}
    into = {r["to_state"] for r in c}
    terminal = bool(reached & set(TERMINAL))
    late = created is not None and as_of_ns - created > (deadline + SETTLE_GRACE_MS) * 1_000_000
    a = bool(reached & set(ACCEPTED_OR_LATER))
    e = bool(reached & set(EXECUTED))
    results = [r for r in c if r["event"] in RESULT_EVENTS]
    v = False
    if e and results:
        first = min(_key(r["from_state"], r["to_state"]) for r in results)
        firsts = [r for r in results if _key(r["from_state"], r["to_state"]) == first]
        v = all(_evidence_ok(r) for r in firsts)
    v_claimed = v
    v = v and not evidence_check(rows).failed
    k = v and bool(reached & {"committed", "verified"})
    unk = "unknown" in into
    left = any(r["from_state"] == "unknown" for r in c)
    unknown_in = [int(r["time_ns"]) for r in c if r["to_state"] == "unknown"]
    return HandoffFacts(
        handoff_id=handoff_id,
        created_ns=created,
        deadline_ms=int(deadline),
        mode=mode,
        reached=frozenset(reached),
        settled=terminal or late,
        a=a,
        e=e,
        v=v,
        k=k,
        unk=unk,
        unresolved=unk and not left,
        esc=mode == "escalate" or "escalated" in into,
        rejected="rejected" in into,
        accept_seen=any(r["event"] == "accept" and r["from_state"] == "created" for r in c),
        t_unknown_in=min(unknown_in, default=None),
        v_claimed=v_claimed,
    )


def _evidence_ok(r: Row) -> bool:
    return (r.get("evidence_count") or 0) >= 1 and r.get("evidence_valid") is True


def funnel_counts(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, as_of_ns: int
) -> dict[str, float]:
    """The one-row funnel (counts and rates, NaN when undefined) for rows of any handoffs."""
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(r.get("tenant", "default"), r["handoff_id"])].append(r)
    out = dict.fromkeys(
        ("volume", "settled", "in_flight", "accepted", "executed", "evidence_claimed",
         "evidenced", "committed", "verified", "unknown", "escalated", "unresolved_now"), 0)  # fmt: skip
    for (_t, h), hr in by_h.items():
        f = facts(h, hr, as_of_ns=as_of_ns)
        if f.created_ns is None or not (start_ns <= f.created_ns < end_ns):
            continue
        out["volume"] += 1
        out["unresolved_now"] += f.unresolved
        if not f.settled:
            out["in_flight"] += 1
            continue
        out["settled"] += 1
        out["accepted"] += f.a
        out["executed"] += f.e
        out["evidence_claimed"] += f.v_claimed
        out["evidenced"] += f.v
        out["committed"] += f.k
        out["verified"] += f.k and "verified" in f.reached
        out["unknown"] += f.unk
        out["escalated"] += f.esc

    def rate(n: str, d: str) -> float:
        return out[n] / out[d] if out[d] else math.nan

    res: dict[str, float] = dict(out)
    res.update(
        p_accept=rate("accepted", "settled"),
        p_execute=rate("executed", "accepted"),
        p_evidence=rate("evidenced", "executed"),
        p_evidence_claimed=rate("evidence_claimed", "executed"),
        p_commit=rate("committed", "evidenced"),
        p_e2e=rate("committed", "settled"),
        p_verify=rate("verified", "committed"),
        unknown_rate=rate("unknown", "settled"),
        escalation_rate=rate("escalated", "settled"),
    )
    return res


def handoff_anomalies(
    rows: Sequence[Row], *, as_of_ns: int, unknown_sla_ms: int = UNKNOWN_SLA_MS
) -> list[str]:
    """Anomaly kinds visible from one handoff's own rows (sorted): invalid_transition,
    duplicate_delivery, clock_skew, committed_without_evidence, unknown_unresolved,
    accepted_never_started, implied_accept, orphan_transition, and the evidence checks'
    (analytics.oracle.evidence.EVIDENCE_KINDS). Kinds that need other
    handoffs (idempotency_conflict, stale_fence, bounce, rejection_spike) are not here.

    duplicate_delivery: a transition (event, from, to) stored in more than one copy_key; a
    span stored again unchanged is one (see the module doc)."""
    if not rows:
        return []
    hid = rows[0]["handoff_id"]
    f = facts(hid, rows, as_of_ns=as_of_ns)
    c = [r for r in rows if counted(r)]
    kinds: set[str] = set()
    if f.created_ns is None:
        kinds.add("orphan_transition")
    if len(c) < len(rows) or _forked(c) or _after_terminal(c):
        kinds.add("invalid_transition")
    copies: dict[tuple[str, str, str], set[tuple[str, str, int]]] = defaultdict(set)
    for r in rows:
        copies[(r["event"], r["from_state"], r["to_state"])].add(copy_key(r))
    if any(len(k) > 1 for k in copies.values()):
        kinds.add("duplicate_delivery")
    if _skewed(c):
        kinds.add("clock_skew")
    if f.reached & {"committed", "verified"} and not f.v:
        kinds.add("committed_without_evidence")
    overdue = f.t_unknown_in is not None and as_of_ns - f.t_unknown_in > unknown_sla_ms * 1_000_000
    if f.unresolved and overdue:
        kinds.add("unknown_unresolved")
    if (
        f.created_ns is not None
        and f.a
        and not (f.reached & (set(TERMINAL) | {"running", "prepared", "unknown"}))
    ) and as_of_ns - f.created_ns > f.deadline_ms * 1_000_000:
        kinds.add("accepted_never_started")
    if f.created_ns is not None and f.a and not f.accept_seen:
        kinds.add("implied_accept")
    if f.created_ns is not None:
        kinds.update(evidence_kinds(rows))
    return sorted(kinds)


def _distinct(c: Sequence[Row]) -> dict[tuple[str, str, str], int]:
    """Distinct transitions -> earliest time_ns."""
    out: dict[tuple[str, str, str], int] = {}
    for r in c:
        t = (r["from_state"], r["event"], r["to_state"])
        out[t] = min(out.get(t, int(r["time_ns"])), int(r["time_ns"]))
    return out


def _forked(c: Sequence[Row]) -> bool:
    outs: dict[str, set] = defaultdict(set)
    for f, e, t in _distinct(c):
        if f:
            outs[f].add((e, t))
    return any(len(v) > 1 for v in outs.values())


def _after_terminal(c: Sequence[Row]) -> bool:
    d = list(_distinct(c))
    for tr in d:
        end = tr[2]
        if end not in TERMINAL or end == "committed":
            continue
        for other in d:
            if other != tr and other[0] and end not in reachable_from(other[0]):
                return True
    return False


def _skewed(c: Sequence[Row]) -> bool:
    d = _distinct(c)
    for (f1, _e1, t1), time1 in d.items():
        for (f2, _e2, t2), time2 in d.items():
            if f2 == t1 and t2 != f1 and _key(f1, t1) < _key(f2, t2) and time2 < time1:
                return True
    return False


def task_anomalies(task_rows: Sequence[Row], handoff_id: str) -> list[str]:
    """Cross-handoff kinds for `handoff_id` from all stored rows of its task (sorted):
    stale_fence (a commit of this handoff with a fence token / state version below the
    highest seen earlier in the task, by time then span_id) and bounce (this transfer goes
    straight back to the sender of the task's previous transfer, by created time). Copies
    of a row change neither (a running maximum, an earliest time)."""
    kinds: set[str] = set()
    hi_fence: int | None = None
    hi_version: int | None = None
    for r in sorted(task_rows, key=lambda r: (int(r["time_ns"]), str(r.get("span_id", "")))):
        f, v = r.get("fence_token"), r.get("state_version")
        is_commit = r["handoff_id"] == handoff_id and r["event"] in ("commit", "resolve_committed")
        stale = (f is not None and hi_fence is not None and f < hi_fence) or (
            v is not None and hi_version is not None and v < hi_version
        )
        if is_commit and stale:
            kinds.add("stale_fence")
        if f is not None:
            hi_fence = f if hi_fence is None else max(hi_fence, f)
        if v is not None:
            hi_version = v if hi_version is None else max(hi_version, v)
    transfers: dict[str, tuple[int, str, str]] = {}
    for r in task_rows:
        if counted(r) and r["event"] == "create" and r.get("mode") == "transfer":
            prev = transfers.get(r["handoff_id"])
            t = int(r["time_ns"])
            if prev is None or t < prev[0]:
                transfers[r["handoff_id"]] = (t, r.get("from_agent", ""), r.get("to_agent", ""))
    order = sorted(transfers.items(), key=lambda kv: (kv[1][0], kv[0]))
    for (_h1, (_t1, a1, b1)), (h2, (_t2, a2, b2)) in itertools.pairwise(order):
        if h2 == handoff_id and a2 and a2 == b1 and b2 == a1:
            kinds.add("bounce")
    return sorted(kinds)
