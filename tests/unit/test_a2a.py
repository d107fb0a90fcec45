"""A2A task states mapped onto handoff events, also driven through the real tracer."""

from __future__ import annotations

import enum

import pytest

from collector import (
    A2A_STATES,
    Envelope,
    HandoffTracer,
    IllegalTransition,
    InMemoryRecorder,
    a2a_event,
    a2a_events,
    semconv,
)
from collector.contract import NON_TERMINAL, STATES, TERMINAL, TRANSITIONS, Event, State

E, S = Event, State


@pytest.mark.parametrize(
    ("a2a", "state", "expected"),
    [
        ("submitted", "created", None),
        ("working", "created", E.ACCEPT),
        ("working", "accepted", E.START),
        ("working", "running", None),
        ("input-required", "running", None),
        ("auth-required", "running", None),
        ("input-required", "prepared", None),
        ("input-required", "accepted", E.START),
        ("completed", "running", E.COMMIT),
        ("completed", "prepared", E.COMMIT),
        ("completed", "unknown", E.RESOLVE_COMMITTED),
        ("completed", "committed", None),
        ("completed", "verified", None),
        ("failed", "running", E.FAIL),
        ("failed", "unknown", E.RESOLVE_FAILED),
        ("failed", "failed", None),
        ("canceled", "running", E.CANCEL),
        ("canceled", "canceled", None),
        ("rejected", "created", E.REJECT),
        ("rejected", "rejected", None),
        ("unknown", "running", E.TIMEOUT),
        ("unknown", "committed", None),
    ],
)
def test_mapping(a2a, state, expected):
    assert a2a_event(a2a, state) == expected


def test_input_and_auth_required_never_move_a_running_handoff():
    for a2a in ("input-required", "auth-required"):
        for state in ("running", "prepared", "unknown", *[str(s) for s in TERMINAL]):
            assert a2a_event(a2a, state) is None


@pytest.mark.parametrize(
    ("a2a", "state", "illegal"),
    [
        ("completed", "failed", E.COMMIT),
        ("failed", "committed", E.FAIL),
        ("rejected", "running", E.REJECT),
        ("canceled", "verified", E.CANCEL),
    ],
)
def test_contradictions_return_the_implied_illegal_event(a2a, state, illegal):
    ev = a2a_event(a2a, state)
    assert ev == illegal
    assert (State(state), ev) not in TRANSITIONS


def test_paths_walk_skipped_steps():
    assert a2a_events("completed", "created") == (E.ACCEPT, E.START, E.COMMIT)
    assert a2a_events("failed", "accepted") == (E.START, E.FAIL)
    assert a2a_events("working", "created") == (E.ACCEPT, E.START)
    assert a2a_events("submitted", "created") == ()
    assert a2a_events("completed", "failed") == (E.COMMIT,)  # stops at the contradiction


def test_every_pair_terminates_and_legal_walks_land_where_a2a_says():
    lands = {
        "completed": {S.COMMITTED},
        "failed": {S.FAILED},
        "canceled": {S.CANCELED},
        "rejected": {S.REJECTED},
        # working after a timeout records nothing: only a result resolves `unknown`
        "working": {S.RUNNING, S.PREPARED, S.UNKNOWN},
    }
    for a2a in A2A_STATES:
        for state in STATES:
            path = a2a_events(a2a, state)
            assert len(path) <= 3
            cur = state
            for i, ev in enumerate(path):
                nxt = TRANSITIONS.get((cur, ev))
                if nxt is None:  # only the last event may be the illegal contradiction
                    assert i == len(path) - 1
                    break
                cur = nxt
            else:
                if a2a in lands and state in NON_TERMINAL:
                    assert cur in lands[a2a], (a2a, state, cur)


class _ProtoLike(enum.Enum):
    TASK_STATE_INPUT_REQUIRED = 6
    TASK_STATE_CANCELLED = 5


class _JsonLike(enum.StrEnum):
    completed = "completed"


def test_state_name_forms_are_normalized():
    assert a2a_event("TASK_STATE_WORKING", "created") == E.ACCEPT
    assert a2a_event(_ProtoLike.TASK_STATE_INPUT_REQUIRED, "running") is None
    assert a2a_event(_ProtoLike.TASK_STATE_CANCELLED, "running") == E.CANCEL
    assert a2a_event(_JsonLike.completed, "running") == E.COMMIT
    assert a2a_event(" Input-Required ", "accepted") == E.START
    assert a2a_event("TASK_STATE_UNSPECIFIED", "running") == E.TIMEOUT


def test_bad_input_is_named():
    with pytest.raises(
        ValueError, match="a2a_state: unknown A2A task state 'done'; expected one of submitted"
    ):
        a2a_event("done", "created")
    with pytest.raises(ValueError, match="a2a_state: expected an A2A task state name, got int 3"):
        a2a_event(3, "created")
    with pytest.raises(ValueError, match="current_state: unknown handoff state 'finished'"):
        a2a_event("completed", "finished")


def _envelope(hid: str) -> Envelope:
    return Envelope(
        task_id="t",
        handoff_id=hid,
        from_agent="client",
        to_agent="remote",
        mode="delegate",
        topology="federated_a2a",
    )


def test_driving_a_tracer_from_a2a_status_updates():
    rec = InMemoryRecorder()
    client = HandoffTracer("client", tracer_provider=rec.provider)
    h = client.create(_envelope("h1"))
    for update in ("submitted", "working", "input-required", "working", "completed"):
        for ev in a2a_events(update, h.state):
            h.transition(ev)
    assert h.state == "committed"
    assert [r[semconv.EVENT] for r in rec.transitions()] == ["create", "accept", "start", "commit"]

    h2 = client.create(_envelope("h2"))
    rejected = a2a_event("rejected", h2.state)
    assert rejected is not None
    h2.transition(rejected, error_code="a2a_rejected")
    (ev,) = a2a_events("completed", h2.state)
    with pytest.raises(
        IllegalTransition, match="event 'commit' is not allowed from state 'rejected'"
    ):
        h2.transition(ev)

    lenient = HandoffTracer("client", tracer_provider=rec.provider, strict=False)
    h3 = lenient.receive(h2.to_wire())
    for ev in a2a_events("completed", h3.state):
        h3.transition(ev)
    assert h3.state == "rejected"
    assert rec.transitions()[-1][semconv.VALID] is False
    rec.shutdown()
