from hypothesis import given
from hypothesis import strategies as st

from collector.contract import (
    NON_TERMINAL,
    TERMINAL,
    TRANSITIONS,
    Event,
    IllegalTransition,
    State,
    is_legal,
    next_state,
    reachable_from,
)


def test_create_only_from_nothing():
    assert next_state(None, "create") == State.CREATED
    try:
        next_state("created", "create")
    except IllegalTransition as exc:
        assert "already exists" in str(exc)
    else:
        raise AssertionError("create twice must be refused")


def test_illegal_names_allowed_events():
    try:
        next_state("created", "commit")
    except IllegalTransition as exc:
        assert "'commit' is not allowed from state 'created'" in str(exc)
        assert "accept" in str(exc)
    else:
        raise AssertionError


def test_terminal_except_committed_has_no_exits():
    for s in TERMINAL - {State.COMMITTED}:
        assert not [k for k in TRANSITIONS if k[0] == s]
    assert {e for (s, e) in TRANSITIONS if s == State.COMMITTED} == {Event.VERIFY, Event.VERIFY_FAIL}


def test_cancel_escalate_from_every_non_terminal():
    for s in NON_TERMINAL:
        assert TRANSITIONS[(s, Event.CANCEL)] == State.CANCELED
        assert TRANSITIONS[(s, Event.ESCALATE)] == State.ESCALATED


@given(st.lists(st.sampled_from(list(Event)), max_size=30))
def test_any_event_sequence_stays_legal(events):
    state = next_state(None, "create")
    for ev in events:
        try:
            new = next_state(state, ev)
        except IllegalTransition:
            continue  # refused: state unchanged
        assert is_legal(state, ev, new)
        if state in TERMINAL and state != State.COMMITTED:
            raise AssertionError(f"terminal {state} moved to {new}")
        state = new
    assert state in set(State)


def test_committed_reachable():
    assert State.COMMITTED in reachable_from("created")
    assert reachable_from("verified") == {State.VERIFIED}
