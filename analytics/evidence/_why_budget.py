"""Why a budget kind flagged a handoff: the transition of its own rows, the envelope's promise
and how far it was missed (pure; the kinds: analytics/_sql/budget.py, their oracle
analytics/oracle/budget.py, definitions docs/metrics.md).

Each function takes the handoff's rows (as analytics.evidence._why's, with `deadline_ms` on create
rows) and the clock the kind was judged at (`as_of_ns`: ack_missing counts a handoff still
waiting once the clock is past its ttl) and returns a Reason, or None when the rows do not
show the kind. REASONS maps each kind to its function; analytics.evidence._why_store registers them
for the package's findings of those kinds. The facts are oracle.budget's readings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from analytics.evidence._why import Reason, _first, _secs, _span, _step, _when
from analytics.oracle.audit import attrs, is_create
from analytics.oracle.budget import OUTCOME_STATES, first_terminal
from analytics.oracle.funnel import counted
from analytics.oracle.topology import parse_int
from collector import semconv as sc
from collector.contract import RESULT_EVENTS

__all__ = ["REASONS"]

Row = Mapping[str, Any]
_MS: Final = 1_000_000
_S: Final = 1_000_000_000


def _created(rows: Sequence[Row]) -> tuple[list[Row], int] | None:
    cr = [r for r in rows if is_create(r)]
    return (cr, min(int(r["time_ns"]) for r in cr)) if cr else None


def _max_int(rows: Sequence[Row], name: str) -> int | None:
    vals = [v for r in rows if (v := parse_int(attrs(r).get(name))) is not None]
    return max(vals) if vals else None


def deadline_overrun(rows: Sequence[Row], *, as_of_ns: int) -> Reason | None:
    """The first transition into the first terminal outcome, past the envelope's deadline."""
    got = _created(rows)
    first = first_terminal(rows)
    if got is None or first is None or first[0] not in OUTCOME_STATES:
        return None
    cr, created = got
    deadlines = [int(r["deadline_ms"]) for r in cr if r.get("deadline_ms") is not None]
    state, t = first
    if not deadlines or t - created <= max(deadlines) * _MS:
        return None
    into = _first(
        r for r in rows if counted(r) and r["to_state"] == state and int(r["time_ns"]) == t
    )
    assert into is not None
    return _span(
        "deadline_overrun",
        into,
        f"{_step(into)} reached {state} {_secs(t - created)} after the handoff was created "
        f"({_when(created)}), past its {sc.DEADLINE_MS} = {max(deadlines)}",
        sc.DEADLINE_MS,
        str(max(deadlines)),
    )


def tool_budget_exceeded(rows: Sequence[Row], *, as_of_ns: int) -> Reason | None:
    """The first result row recording more tool calls than the envelope's budget."""
    got = _created(rows)
    budget = _max_int(got[0], sc.MAX_TOOL_CALLS) if got is not None else None
    if budget is None:
        return None
    over = _first(
        r
        for r in rows
        if r["event"] in RESULT_EVENTS
        and (calls := parse_int(attrs(r).get(sc.TOOL_CALLS))) is not None
        and calls > budget
    )
    if over is None:
        return None
    used = attrs(over)[sc.TOOL_CALLS]
    return _span(
        "tool_budget_exceeded",
        over,
        f"{_step(over)} records {sc.TOOL_CALLS} = {used}, over the envelope's "
        f"{sc.MAX_TOOL_CALLS} = {budget}",
        sc.TOOL_CALLS,
        str(used),
    )


def ack_missing(rows: Sequence[Row], *, as_of_ns: int) -> Reason | None:
    """The acknowledgement that came after the ttl, or the create asking for one that never
    came by the clock."""
    got = _created(rows)
    if got is None:
        return None
    cr, created = got
    ttl = _max_int(cr, sc.MESSAGE_TTL_S)
    if ttl is None or not any(attrs(r).get(sc.MESSAGE_REQUIRES_ACK) == "true" for r in cr):
        return None
    ack = _first(
        r
        for r in rows
        if counted(r)
        and r["from_state"] == "created"
        and (r["event"], r["to_state"]) in (("accept", "accepted"), ("reject", "rejected"))
    )
    asked = f"{sc.MESSAGE_REQUIRES_ACK} = true within {sc.MESSAGE_TTL_S} = {ttl}"
    if ack is not None:
        late = int(ack["time_ns"]) - created
        if late <= ttl * _S:
            return None
        return _span(
            "ack_missing",
            ack,
            f"{_step(ack)} came {_secs(late)} after the handoff was created "
            f"({_when(created)}), which asked for an acknowledgement ({asked}): too late",
            sc.MESSAGE_TTL_S,
            str(ttl),
        )
    if as_of_ns - created <= ttl * _S:
        return None
    env = _first(cr)
    assert env is not None
    return _span(
        "ack_missing",
        env,
        f"{_step(env)} asked for an acknowledgement ({asked}); no accept or reject came by "
        f"{_when(as_of_ns)}, {_secs(as_of_ns - created)} after it",
        sc.MESSAGE_TTL_S,
        str(ttl),
    )


#: kind -> its reason from the handoff's own rows at the clock
REASONS: Final[Mapping[str, Callable[..., Reason | None]]] = {
    "deadline_overrun": deadline_overrun,
    "tool_budget_exceeded": tool_budget_exceeded,
    "ack_missing": ack_missing,
}
