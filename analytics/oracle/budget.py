"""The envelope's promises of time and effort in plain Python over transition rows: the
oracle the SQL of the deadline and budget passes (analytics/_sql/budget.py) is tested
against. Definitions: docs/metrics.md.

Rows as in analytics.oracle.funnel (`time_ns` in ns), plus `attributes` (the map as stored: ints
as decimal text, bools as true/false) and `deadline_ms` on create rows. The envelope is the
handoff's counted create rows (the greatest value when several disagree), its `created`
their earliest time. Reads collector/contract.py only: no SQL, no bit masks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from analytics.oracle.audit import attrs, is_create
from analytics.oracle.funnel import Row, counted
from analytics.oracle.topology import parse_int
from collector import semconv as sc
from collector.contract import RESULT_EVENTS, STATE_RANK, TERMINAL, State

__all__ = [
    "BUDGET_KINDS",
    "OUTCOME_STATES",
    "budget_anomalies",
    "budget_kinds",
    "first_terminal",
]

#: the kinds budget_anomalies computes
BUDGET_KINDS: Final = ("deadline_overrun", "tool_budget_exceeded", "ack_missing")
#: the first terminal states that end the receiver's work (expired, canceled, escalated are
#: the sender ending the handoff; verified first: the commit itself was never stored)
OUTCOME_STATES: Final = frozenset({State.COMMITTED, State.FAILED, State.REJECTED})
_MS: Final = 1_000_000
_S: Final = 1_000_000_000


def _order(r: Row) -> tuple[int, int, str]:
    """Machine order of a counted row: (rank of from + 1, or 0 for create; rank of to),
    then the event name."""
    fr = STATE_RANK[State(r["from_state"])] + 1 if r["from_state"] else 0
    return fr, STATE_RANK[State(r["to_state"])], str(r["event"])


def first_terminal(rows: Iterable[Row]) -> tuple[str, int] | None:
    """The terminal state the handoff reached first in machine order (of its counted
    transitions into a terminal state, the first by rank of from, rank of to, then event
    name) and the earliest time (ns) of any counted transition into that state; None when
    it reached none."""
    into = [r for r in rows if counted(r) and r["to_state"] in TERMINAL]
    if not into:
        return None
    state = min(into, key=_order)["to_state"]
    return str(state), min(int(r["time_ns"]) for r in into if r["to_state"] == state)


def _max_int(rows: Iterable[Row], name: str) -> int | None:
    vals = [v for r in rows if (v := parse_int(attrs(r).get(name))) is not None]
    return max(vals) if vals else None


def budget_kinds(rows: Sequence[Row], *, as_of_ns: int) -> set[str]:
    """The budget kinds of one handoff's stored rows (copies included: every fact is a
    maximum, a minimum or any()); empty without a counted create.

    deadline_overrun: the envelope has deadline_ms, the first terminal state is an outcome
    (OUTCOME_STATES) and was reached more than deadline_ms after created.
    tool_budget_exceeded: the greatest tool_calls of a result row (any prepare, commit or
    resolve_committed row) > the envelope's max_tool_calls.
    ack_missing: the envelope has requires_ack = true and ttl_s; the first counted accept or
    reject (from created) came more than ttl_s after created, or none came and as_of is
    more than ttl_s after created."""
    cr = [r for r in rows if is_create(r)]
    if not cr:
        return set()
    created = min(int(r["time_ns"]) for r in cr)
    kinds: set[str] = set()
    deadlines = [int(r["deadline_ms"]) for r in cr if r.get("deadline_ms") is not None]
    first = first_terminal(rows)
    if (
        deadlines
        and first is not None
        and first[0] in OUTCOME_STATES
        and first[1] - created > max(deadlines) * _MS
    ):
        kinds.add("deadline_overrun")
    used = _max_int((r for r in rows if r["event"] in RESULT_EVENTS), sc.TOOL_CALLS)
    budget = _max_int(cr, sc.MAX_TOOL_CALLS)
    if used is not None and budget is not None and used > budget:
        kinds.add("tool_budget_exceeded")
    wants = any(attrs(r).get(sc.MESSAGE_REQUIRES_ACK) == "true" for r in cr)
    ttl = _max_int(cr, sc.MESSAGE_TTL_S)
    if wants and ttl is not None:
        acks = [
            int(r["time_ns"])
            for r in rows
            if counted(r)
            and r["from_state"] == "created"
            and (r["event"], r["to_state"]) in (("accept", "accepted"), ("reject", "rejected"))
        ]
        if (min(acks) if acks else as_of_ns) - created > ttl * _S:
            kinds.add("ack_missing")
    return kinds


def budget_anomalies(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, as_of_ns: int
) -> dict[tuple[str, str], set[str]]:
    """{(tenant, handoff_id): its budget kinds} for the handoffs created in [start_ns,
    end_ns) that have any."""
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by[(str(r.get("tenant") or ""), str(r["handoff_id"]))].append(r)
    out: dict[tuple[str, str], set[str]] = {}
    for key, hr in by.items():
        creates = [int(r["time_ns"]) for r in hr if is_create(r)]
        if not creates or not start_ns <= min(creates) < end_ns:
            continue
        kinds = budget_kinds(hr, as_of_ns=as_of_ns)
        if kinds:
            out[key] = kinds
    return out
