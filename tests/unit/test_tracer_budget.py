"""The shim's tool calls and its strict receiver's refusals, on the real SDK with the
in-memory recorder: `tool_calls=` and `count_tool_call()` on results; a refused message
emitted as the receiver's flagged `reject` (error_code `conflict`) before the exception,
never by the sender; and the docs/agent-developers.md example of both, run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collector import (
    Envelope,
    HandoffTracer,
    IllegalTransition,
    InMemoryRecorder,
    replaying,
    semconv,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-developers.md"


def envelope(**kw: object) -> Envelope:
    base: dict = {"task_id": "t1", "handoff_id": "h1", "from_agent": "planner",
                  "to_agent": "coder", "mode": "delegate", "max_tool_calls": 3}  # fmt: skip
    return Envelope(**{**base, **kw})


@pytest.fixture
def pair():
    rec = InMemoryRecorder()
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    coder = HandoffTracer("coder", tracer_provider=rec.provider, supported_versions=(1,))
    yield rec, planner, coder
    rec.shutdown()


def by_event(rec: InMemoryRecorder, event: str) -> list[dict]:
    return [t for t in rec.transitions() if t[semconv.EVENT] == event]


def test_counted_tool_calls_ride_on_every_later_result(pair):
    rec, planner, coder = pair
    work = coder.receive(planner.create(envelope()).to_wire())
    work.accept()
    assert work.tool_calls is None
    work.start()  # no count yet: nothing on the start
    assert work.count_tool_call() == 1
    assert work.count_tool_call(2) == 3
    work.prepare(evidence_count=1, evidence_valid=True)
    assert work.count_tool_call() == 4
    work.commit()
    assert semconv.TOOL_CALLS not in by_event(rec, "start")[0]
    assert by_event(rec, "prepare")[0][semconv.TOOL_CALLS] == 3
    assert by_event(rec, "commit")[0][semconv.TOOL_CALLS] == 4  # the running total
    assert work.tool_calls == 4


def test_an_explicit_tool_calls_wins_and_is_checked(pair):
    rec, planner, coder = pair
    work = coder.receive(planner.create(envelope()).to_wire())
    work.accept()
    work.start()
    work.count_tool_call(5)
    work.commit(tool_calls=2)
    assert by_event(rec, "commit")[0][semconv.TOOL_CALLS] == 2
    other = coder.receive(planner.create(envelope(handoff_id="h2")).to_wire())
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="tool_calls: expected int >= 0"):
            other.accept(tool_calls=bad)
    for bad_n in (-1, 2.0, None, False):
        with pytest.raises(ValueError, match="n: expected an int >= 0"):
            other.count_tool_call(bad_n)  # type: ignore[arg-type]
    assert other.count_tool_call(0) == 0  # counting zero still starts the count
    other.accept()
    other.start()
    other.commit()
    assert by_event(rec, "commit")[-1][semconv.TOOL_CALLS] == 0


def test_a_strict_receiver_records_a_refused_message_as_its_reject(pair):
    rec, planner, coder = pair
    h = planner.create(envelope())
    h.expire()  # the sender ended it
    late = coder.receive(h.to_wire())  # the receiver learns the state from the message
    with pytest.raises(IllegalTransition, match=r"allowed: none \(terminal state\)"):
        late.accept(at=1_800_000_000 * 10**9)
    assert late.state == "expired"
    (reject,) = by_event(rec, "reject")
    assert reject[semconv.ACTOR] == "coder"
    assert (reject[semconv.FROM_STATE], reject[semconv.TO_STATE]) == ("expired", "rejected")
    assert reject[semconv.VALID] is False
    assert reject[semconv.ERROR_CODE] == "conflict"
    assert reject[semconv.INVALID_REASON] == (
        "refused 'accept': event 'accept' is not allowed from state 'expired'; allowed: none "
        "(terminal state)"
    )
    assert reject[semconv.CONSUMER_SUPPORTED_VERSIONS] == (1,)  # its window, as on any reject
    assert rec.spans()[-1].start_time == 1_800_000_000 * 10**9  # at the refused call's time
    # in created a reject would be legal: the refusal is still flagged, the state unchanged
    early = coder.receive(planner.create(envelope(handoff_id="h2")).to_wire())
    with replaying(), pytest.raises(IllegalTransition):
        early.commit()
    flagged = by_event(rec, "reject")[-1]
    assert (flagged[semconv.FROM_STATE], flagged[semconv.VALID]) == ("created", False)
    assert flagged[semconv.REPLAY] is True
    assert early.state == "created" and early.accept() == "accepted"


def test_the_sender_and_a_lenient_receiver_record_no_refusal(pair):
    rec, planner, coder = pair
    h = planner.create(envelope())
    h.cancel()
    with pytest.raises(IllegalTransition):
        h.expire()  # the sender's own illegal call: its bug, only raised
    assert by_event(rec, "reject") == []
    lenient = HandoffTracer("coder", tracer_provider=rec.provider, strict=False)
    late = lenient.receive(h.to_wire())
    assert late.accept() == "canceled"  # emitted flagged, as before: no reject added
    assert by_event(rec, "reject") == []
    assert by_event(rec, "accept")[0][semconv.VALID] is False
    # an unknown event is a programming error on both sides: raised, nothing recorded
    with pytest.raises(IllegalTransition, match="unknown event"):
        coder.receive(h.to_wire()).transition("explode")
    assert by_event(rec, "reject") == []


def test_the_agent_developers_example_runs_as_written():
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
        if "count_tool_call" in b
    ]
    rec = InMemoryRecorder()
    names = {
        "Envelope": Envelope,
        "IllegalTransition": IllegalTransition,
        "planner": HandoffTracer("planner", tracer_provider=rec.provider),
        "coder": HandoffTracer("coder", tracer_provider=rec.provider),
    }
    exec(compile(block, str(DOC), "exec"), names)
    rows = {(t[semconv.HANDOFF_ID], t[semconv.EVENT]): t for t in rec.transitions()}
    create = rows[("task-49/coder/1", "create")]
    assert create[semconv.MESSAGE_REQUIRES_ACK] is True and create[semconv.MESSAGE_TTL_S] == 30
    assert rows[("task-49/coder/1", "commit")][semconv.TOOL_CALLS] == 2
    refusal = rows[("task-50/coder/1", "reject")]
    assert (refusal[semconv.ERROR_CODE], refusal[semconv.VALID]) == ("conflict", False)
