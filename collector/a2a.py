"""A2A task states mapped onto handoff events.

An A2A task reports one state at a time (`submitted`, `working`, `input-required`,
`auth-required`, `completed`, `failed`, `canceled`, `rejected`, `unknown`). `a2a_event`
returns the NEXT handoff event that moves the handoff from `current_state` toward what the
A2A state says, or None when there is nothing to record. An A2A state that skips steps
(a task seen `completed` while the handoff is still `created`) is walked one legal step at
a time: call again with the new state, or use `a2a_events` for the whole path. The steps
are implied, not invented: A2A `completed` means the agent accepted and worked on it.

Rules (the generated table is in docs/semantic-conventions.md):
- `submitted`: never an event (the handoff's `create` is the submission).
- `working`, `input-required`, `auth-required`: step to `running` (accept, then start);
  once running (or past it) they record nothing. input-required and auth-required keep the
  handoff RUNNING: waiting for the caller is not a transition in our machine.
- `completed`: step to `committed` (accept, start, commit); from `unknown` it is
  `resolve_committed`; nothing once committed or verified.
- `failed`: step to `failed` (accept, start, fail); from `unknown` it is `resolve_failed`.
- `canceled`: `cancel` from any non-terminal state. `rejected`: `reject` from `created`.
  The code such an end carries: `a2a_state_error_code` (a task its agent rejects refuses the
  skill asked for: `unknown_capability`, unless the agent names another code).
- `unknown` (A2A cannot tell): `timeout` into our `unknown` from created, accepted,
  running or prepared; nothing elsewhere.
- An A2A state that contradicts a terminal handoff (`completed` after `failed`, `rejected`
  while running, ...) returns the event A2A implies even though it is ILLEGAL from
  `current_state`: a strict tracer refuses it, a lenient one records it flagged. It is
  never silently turned into another event.
"""

from __future__ import annotations

import re
from typing import Any, Final

from collector.contract import TERMINAL, TRANSITIONS, Event, State

__all__ = [
    "A2A_ERROR_CODES",
    "A2A_HTTP_CODES",
    "A2A_STATES",
    "A2A_STATE_ERROR_CODES",
    "a2a_error_code",
    "a2a_event",
    "a2a_events",
    "a2a_state_error_code",
    "normalize_a2a_state",
]

S, E = State, Event

A2A_STATES: Final = (
    "submitted",
    "working",
    "input-required",
    "auth-required",
    "completed",
    "failed",
    "canceled",
    "rejected",
    "unknown",
)
_ALIASES: Final = {"cancelled": "canceled", "unspecified": "unknown"}

# Walk toward `running`; shared by the states that mean "the agent is on it".
_TO_RUNNING: Final = {S.CREATED: E.ACCEPT, S.ACCEPTED: E.START}

#: a2a state -> (legal steps by current state, event A2A implies when none applies, states
#: where A2A agrees with the handoff and nothing is recorded).
_RULES: Final[dict[str, tuple[dict[State, Event], Event | None, frozenset[State]]]] = {
    "submitted": ({}, None, frozenset(State)),
    "working": (_TO_RUNNING, None, frozenset(State)),
    "input-required": (_TO_RUNNING, None, frozenset(State)),
    "auth-required": (_TO_RUNNING, None, frozenset(State)),
    "completed": (
        {**_TO_RUNNING, S.RUNNING: E.COMMIT, S.PREPARED: E.COMMIT, S.UNKNOWN: E.RESOLVE_COMMITTED},
        E.COMMIT,
        frozenset({S.COMMITTED, S.VERIFIED}),
    ),
    "failed": (
        {**_TO_RUNNING, S.RUNNING: E.FAIL, S.PREPARED: E.FAIL, S.UNKNOWN: E.RESOLVE_FAILED},
        E.FAIL,
        frozenset({S.FAILED}),
    ),
    "canceled": (
        {s: E.CANCEL for s in State if s not in TERMINAL},
        E.CANCEL,
        frozenset({S.CANCELED}),
    ),
    "rejected": ({S.CREATED: E.REJECT}, E.REJECT, frozenset({S.REJECTED})),
    "unknown": (
        {S.CREATED: E.TIMEOUT, S.ACCEPTED: E.TIMEOUT, S.RUNNING: E.TIMEOUT, S.PREPARED: E.TIMEOUT},
        None,
        frozenset(State),
    ),
}


def normalize_a2a_state(a2a_state: Any) -> str:
    """The A2A state as its JSON name (`input-required`), from that name, a protobuf-style
    name (`TASK_STATE_INPUT_REQUIRED`), or an enum whose value/name is one of those.
    `cancelled` and `unspecified` are read as `canceled` and `unknown`. ValueError otherwise."""
    raw = a2a_state
    value = getattr(raw, "value", raw)
    if not isinstance(value, str):
        value = getattr(raw, "name", value)
    if not isinstance(value, str):
        raise ValueError(
            f"a2a_state: expected an A2A task state name, got {type(raw).__name__} {raw!r}"
        )
    v = value.strip().lower()
    v = v.removeprefix("task_state_").removeprefix("taskstate.").replace("_", "-")
    v = _ALIASES.get(v, v)
    if v not in _RULES:
        raise ValueError(
            f"a2a_state: unknown A2A task state {raw!r}; expected one of {', '.join(A2A_STATES)}"
        )
    return v


def a2a_event(a2a_state: Any, current_state: str) -> Event | None:
    """The next handoff event toward `a2a_state` from `current_state`, or None (nothing to
    record). The event is legal from `current_state` unless A2A contradicts the handoff (see
    the module doc). Raises ValueError for an unknown A2A state or handoff state."""
    name = normalize_a2a_state(a2a_state)
    if current_state not in State.__members__.values():
        raise ValueError(f"current_state: unknown handoff state {current_state!r}")
    cur = State(current_state)
    steps, implied, agrees = _RULES[name]
    ev = steps.get(cur)
    if ev is not None:
        return ev
    if cur in agrees or implied is None:
        return None
    return implied


def a2a_events(a2a_state: Any, current_state: str) -> tuple[Event, ...]:
    """Every event from `current_state` to where `a2a_state` leads, in order (possibly
    empty). When A2A contradicts the machine, the last event is the illegal one a2a_event
    returned; the walk stops there."""
    out: list[Event] = []
    state = current_state
    while True:
        ev = a2a_event(a2a_state, state)
        if ev is None:
            return tuple(out)
        out.append(ev)
        nxt = TRANSITIONS.get((State(state), ev))
        if nxt is None:
            return tuple(out)
        state = nxt


#: a2a-sdk refusal errors (class names, a2a.utils.errors / a2a.client.errors) -> the nearest
#: `handoff.error_code` of semconv.ERROR_CODES. An error not listed (InternalError,
#: InvalidAgentResponseError, ...: not a refusal of the request) keeps a code of its own,
#: `a2a_<snake_case name>`, stored as sent and counted as `other`.
A2A_ERROR_CODES: Final = {
    # the two ends do not speak the same thing
    "VersionNotSupportedError": "incompatible_protocol",
    "ExtensionSupportRequiredError": "incompatible_protocol",
    "ContentTypeNotSupportedError": "incompatible_protocol",
    # the request as sent cannot be read or names what the receiver does not hold
    "InvalidParamsError": "invalid_envelope",
    "InvalidRequestError": "invalid_envelope",
    "JSONParseError": "invalid_envelope",
    "TaskNotFoundError": "invalid_envelope",
    # the receiver does not offer the operation
    "UnsupportedOperationError": "unknown_capability",
    "MethodNotFoundError": "unknown_capability",
    "PushNotificationNotSupportedError": "unknown_capability",
    "ExtendedAgentCardNotConfiguredError": "unknown_capability",
    # the task's state forbids it
    "TaskNotCancelableError": "conflict",
    # the client gave up waiting
    "A2AClientTimeoutError": "deadline",
}
#: HTTP status of an a2a-sdk client error ("HTTP Error 401: ...", AgentCardResolutionError's
#: status_code) -> code; other statuses fall through to the class name.
A2A_HTTP_CODES: Final = {
    401: "permission_denied",
    403: "permission_denied",
    408: "deadline",
    409: "conflict",
    415: "incompatible_protocol",
    429: "busy",
    503: "busy",
    504: "deadline",
}
_HTTP_RE: Final = re.compile(r"HTTP Error (\d{3})")
#: A2A task state an agent ends a task in -> the `handoff.error_code` of the event it maps
#: to (`fail`, `cancel`, `reject`). An agent that rejects a task it was sent says it will
#: not perform it: the refusal of the skill asked for, `unknown_capability`, the code the
#: Agent Card checks read (stale_agent_card, card_skill_refused). An agent that rejects
#: for another reason names it (a2a_state_error_code's `stated`).
A2A_STATE_ERROR_CODES: Final = {
    "failed": "a2a_failed",
    "canceled": "a2a_canceled",
    "rejected": "unknown_capability",
}


def _snake(name: str) -> str:
    """`InvalidAgentResponseError` -> `invalid_agent_response`, `A2AClientError` -> `client`."""
    base = name.replace("A2A", "").removesuffix("Error") or "error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", base).lower()


def a2a_error_code(error: BaseException) -> str:
    """The `handoff.error_code` for an a2a-sdk error (A2A_ERROR_CODES, looked up along the
    class's bases so subclasses map too; an HTTP 401/403/429/... status of a client error
    first), else `a2a_<snake_case class name>`. Takes any exception; never raises."""
    status = getattr(error, "status_code", None)
    if not isinstance(status, int):
        m = _HTTP_RE.search(str(error))
        status = int(m.group(1)) if m else None
    if status in A2A_HTTP_CODES:
        return A2A_HTTP_CODES[status]
    for cls in type(error).__mro__:
        code = A2A_ERROR_CODES.get(cls.__name__)
        if code is not None:
            return code
    return f"a2a_{_snake(type(error).__name__)}"


def a2a_state_error_code(a2a_state: Any, stated: Any = None) -> str:
    """The `handoff.error_code` of the event an A2A task state ends a handoff with
    (A2A_STATE_ERROR_CODES; another state: `a2a_<state>`). `stated`: the code the agent put
    on the task's status message (a non-empty str wins, stored as sent; anything else is
    ignored). ValueError for an unknown A2A state."""
    if isinstance(stated, str) and stated.strip():
        return stated.strip()
    name = normalize_a2a_state(a2a_state)
    return A2A_STATE_ERROR_CODES.get(name, f"a2a_{name.replace('-', '_')}")
