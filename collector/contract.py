"""The handoff state machine: the single source of truth for states, events and transitions.

The shim (collector/), ingest validation (ingest/), the SQL rank tables (sql/) and the docs
(docs/semantic-conventions.md) all read this module or are tested against it. Nothing else
in the code base spells a transition out by hand.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "ACCEPTED_OR_LATER",
    "CREATE_EVENT",
    "EVENTS",
    "EXECUTED",
    "NON_TERMINAL",
    "PROTOCOL",
    "RESULT_EVENTS",
    "RETRY_NEEDS_RESOLUTION",
    "STATES",
    "STATE_RANK",
    "TERMINAL",
    "TRANSITIONS",
    "Event",
    "IllegalTransition",
    "RetryRefused",
    "State",
    "is_legal",
    "next_state",
    "reachable_from",
]

PROTOCOL: Final = "aa-handoff/v1"


class State(StrEnum):
    CREATED = "created"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    RUNNING = "running"
    PREPARED = "prepared"
    COMMITTED = "committed"
    VERIFIED = "verified"
    FAILED = "failed"
    UNKNOWN = "unknown"
    EXPIRED = "expired"
    CANCELED = "canceled"
    ESCALATED = "escalated"


class Event(StrEnum):
    CREATE = "create"
    ACCEPT = "accept"
    REJECT = "reject"
    EXPIRE = "expire"
    TIMEOUT = "timeout"
    START = "start"
    PREPARE = "prepare"
    COMMIT = "commit"
    FAIL = "fail"
    VERIFY = "verify"
    VERIFY_FAIL = "verify_fail"
    RESOLVE_COMMITTED = "resolve_committed"
    RESOLVE_FAILED = "resolve_failed"
    CANCEL = "cancel"
    ESCALATE = "escalate"


S, E = State, Event

STATES: Final = tuple(State)
EVENTS: Final = tuple(Event)
CREATE_EVENT: Final = Event.CREATE

#: Terminal states absorb every event. `committed` is terminal for the funnel but may still
#: move to `verified` (or `unknown` on a failed read-back) exactly once: see TRANSITIONS.
TERMINAL: Final = frozenset(
    {S.REJECTED, S.FAILED, S.EXPIRED, S.CANCELED, S.VERIFIED, S.ESCALATED, S.COMMITTED}
)
NON_TERMINAL: Final = frozenset(set(State) - TERMINAL)

_TABLE: dict[tuple[State, Event], State] = {
    (S.CREATED, E.ACCEPT): S.ACCEPTED,
    (S.CREATED, E.REJECT): S.REJECTED,
    (S.CREATED, E.EXPIRE): S.EXPIRED,
    (S.CREATED, E.TIMEOUT): S.UNKNOWN,
    (S.ACCEPTED, E.START): S.RUNNING,
    (S.ACCEPTED, E.TIMEOUT): S.UNKNOWN,
    (S.RUNNING, E.PREPARE): S.PREPARED,
    (S.RUNNING, E.COMMIT): S.COMMITTED,
    (S.RUNNING, E.FAIL): S.FAILED,
    (S.RUNNING, E.TIMEOUT): S.UNKNOWN,
    (S.PREPARED, E.COMMIT): S.COMMITTED,
    (S.PREPARED, E.FAIL): S.FAILED,
    (S.PREPARED, E.TIMEOUT): S.UNKNOWN,
    (S.COMMITTED, E.VERIFY): S.VERIFIED,
    (S.COMMITTED, E.VERIFY_FAIL): S.UNKNOWN,
    (S.UNKNOWN, E.RESOLVE_COMMITTED): S.COMMITTED,
    (S.UNKNOWN, E.RESOLVE_FAILED): S.FAILED,
}
for _s in NON_TERMINAL:
    _TABLE[(_s, E.CANCEL)] = S.CANCELED
    _TABLE[(_s, E.ESCALATE)] = S.ESCALATED

#: (from_state, event) -> to_state. `create` has no from_state and is not in the table.
TRANSITIONS: Final = MappingProxyType(_TABLE)

#: Events whose transition carries the handoff's result (and its evidence).
RESULT_EVENTS: Final = frozenset({E.PREPARE, E.COMMIT, E.RESOLVE_COMMITTED})
#: States of an attempt that may not be retried yet: after a timeout the outcome is unknown
#: (the receiver may have acted). Query the status by handoff id or idempotency key and
#: record resolve_committed / resolve_failed first; never resend blindly.
RETRY_NEEDS_RESOLUTION: Final = frozenset({S.UNKNOWN})
#: States that imply the receiver accepted (an accept never emitted is implied).
ACCEPTED_OR_LATER: Final = frozenset({S.ACCEPTED, S.RUNNING, S.PREPARED, S.COMMITTED, S.VERIFIED})
#: States that imply execution produced a result.
EXECUTED: Final = frozenset({S.PREPARED, S.COMMITTED, S.VERIFIED})

#: Position of each state along the happy path; used to order transitions of one handoff
#: when agents' clocks disagree (order comes from the machine, not from timestamps).
#: Side exits share the rank of the furthest state they can leave from.
STATE_RANK: Final = MappingProxyType(
    {
        S.CREATED: 0,
        S.ACCEPTED: 1,
        S.REJECTED: 1,
        S.EXPIRED: 1,
        S.RUNNING: 2,
        S.PREPARED: 3,
        S.UNKNOWN: 4,
        S.COMMITTED: 5,
        S.FAILED: 5,
        S.VERIFIED: 6,
        S.CANCELED: 7,
        S.ESCALATED: 7,
    }
)


class IllegalTransition(ValueError):
    """An event that the state table does not allow from the current state."""

    def __init__(self, state: str | None, event: str, reason: str | None = None) -> None:
        self.state = state
        self.event = event
        allowed = sorted(e.value for (s, e) in TRANSITIONS if s == state)
        detail = reason or (
            f"event {event!r} is not allowed from state {state!r}; "
            f"allowed: {', '.join(allowed) if allowed else 'none (terminal state)'}"
        )
        super().__init__(detail)


class RetryRefused(IllegalTransition):
    """A retry of an attempt whose outcome is still unknown (RETRY_NEEDS_RESOLUTION)."""

    def __init__(self, handoff_id: str, state: str) -> None:
        self.handoff_id = handoff_id
        super().__init__(
            state,
            "retry",
            f"retry of {handoff_id!r} refused: its outcome is {state!r} (after a timeout the "
            "receiver may have acted). Query the status by handoff id or idempotency key and "
            "record resolve_committed or resolve_failed first; never resend blindly",
        )


def next_state(state: str | None, event: str) -> State:
    """Return the state `event` leads to from `state`; raise IllegalTransition otherwise.

    `state` None (or "") with event `create` gives `created`; `create` from any state is illegal.
    """
    if event not in Event.__members__.values():
        raise IllegalTransition(state, event, f"unknown event {event!r}")
    if event == E.CREATE:
        if state:
            raise IllegalTransition(state, event, f"handoff already exists in state {state!r}")
        return S.CREATED
    if not state:
        raise IllegalTransition(state, event, f"event {event!r} before create")
    if state not in State.__members__.values():
        raise IllegalTransition(state, event, f"unknown state {state!r}")
    try:
        return TRANSITIONS[(State(state), Event(event))]
    except KeyError:
        raise IllegalTransition(state, event) from None


def is_legal(from_state: str | None, event: str, to_state: str) -> bool:
    """True when (from_state, event) leads to exactly `to_state` under the table."""
    try:
        return next_state(from_state, event) == to_state
    except IllegalTransition:
        return False


def reachable_from(state: str) -> frozenset[State]:
    """Every state reachable from `state` (itself included) along the table."""
    seen = {State(state)}
    frontier = [State(state)]
    while frontier:
        s = frontier.pop()
        for (src, _e), dst in TRANSITIONS.items():
            if src == s and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    return frozenset(seen)
