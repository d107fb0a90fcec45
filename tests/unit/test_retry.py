"""Retries: the next attempt of one task at one target, numbered and linked, and the rule
that after a timeout the outcome is unknown (resolve first, never resend blindly)."""

from __future__ import annotations

import pytest

from collector import Envelope, HandoffTracer, IllegalTransition, InMemoryRecorder, semconv
from collector.contract import RETRY_NEEDS_RESOLUTION, RetryRefused


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def first(**kw) -> Envelope:
    base = dict(
        task_id="t1",
        handoff_id="h1",
        from_agent="planner",
        to_agent="coder",
        mode="delegate",
        idempotency_key="k1",
        causation_id="msg-7",
    )
    return Envelope(**{**base, **kw})


def creates(rec) -> list[dict]:
    return [t for t in rec.transitions() if t[semconv.EVENT] == "create"]


def test_a_first_create_is_attempt_1_and_retries_count_up(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h1 = tracer.create(first())
    h1.reject(error_code="busy")
    h2 = tracer.retry(h1, "h2")
    h2.timeout(error_code="deadline")
    h2.resolve_failed()
    h3 = h2.retry("h3", idempotency_key="k3")
    got = [
        (c[semconv.HANDOFF_ID], c[semconv.ATTEMPT], c.get(semconv.RETRY_OF), c.get(semconv.IDEMPOTENCY_KEY))
        for c in creates(rec)
    ]  # fmt: skip
    assert got == [("h1", 1, None, "k1"), ("h2", 2, "h1", "k1"), ("h3", 3, "h2", "k3")]
    for c in creates(rec):  # same task, same target, same cause
        assert (c[semconv.TASK_ID], c[semconv.TO_AGENT], c[semconv.CAUSATION_ID]) == (
            "t1",
            "coder",
            "msg-7",
        )
        assert semconv.RETRY_UNRESOLVED not in c and semconv.VALID not in c
    assert (h3.envelope.attempt, h3.envelope.retry_of, h3.state) == (3, "h2", "created")


def test_an_explicit_attempt_on_the_envelope_is_the_base_of_the_count(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h4 = tracer.create(first(handoff_id="h4", attempt=4, retry_of="h3"))
    h4.reject()
    tracer.retry(h4, "h5")
    assert [c[semconv.ATTEMPT] for c in creates(rec)] == [4, 5]


def test_other_envelope_fields_may_change_but_not_task_target_or_numbering(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h1 = tracer.create(first(deadline_ms=30_000))
    h1.reject()
    h2 = tracer.retry(h1, "h2", deadline_ms=60_000, objective="try again, smaller")
    assert h2.envelope.deadline_ms == 60_000 and h2.envelope.retry_of == "h1"
    for field in ("task_id", "to_agent", "attempt", "retry_of"):
        with pytest.raises(ValueError, match=f"retry: {field} cannot change"):
            tracer.retry(h1, "h9", **{field: "x"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="previous: expected a Handoff"):
        tracer.retry(first(), "h9")  # type: ignore[arg-type]


def test_strict_refuses_a_retry_while_the_outcome_is_unknown(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h1 = tracer.create(first())
    h1.timeout(error_code="deadline")
    assert h1.state in RETRY_NEEDS_RESOLUTION
    with pytest.raises(RetryRefused) as ei:
        tracer.retry(h1, "h2")
    msg = str(ei.value)
    assert "outcome is 'unknown'" in msg and "resolve_committed or resolve_failed" in msg
    assert "never resend blindly" in msg and ei.value.handoff_id == "h1"
    assert isinstance(ei.value, IllegalTransition)  # callers catching the contract's refusals
    assert [c[semconv.HANDOFF_ID] for c in creates(rec)] == ["h1"]  # nothing emitted
    # resolved (the status was queried: the receiver never acted): the retry is allowed
    h1.resolve_failed()
    h2 = h1.retry("h2")
    assert h2.envelope.attempt == 2


def test_a_resolved_commit_may_still_be_retried_the_caller_decides(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h1 = tracer.create(first())
    h1.timeout()
    h1.resolve_committed(receipt_id="rcpt-1")
    assert tracer.retry(h1, "h2").envelope.retry_of == "h1"


def test_lenient_emits_the_blind_retry_flagged_and_the_create_stays_valid(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider, strict=False)
    h1 = tracer.create(first())
    h1.timeout()
    h2 = tracer.retry(h1, "h2")
    c = creates(rec)[-1]
    assert c[semconv.HANDOFF_ID] == "h2" and c[semconv.RETRY_UNRESOLVED] is True
    # a legal create of a new handoff: not flagged invalid, so funnels count the attempt
    assert semconv.VALID not in c and semconv.INVALID_REASON not in c
    assert h2.state == "created" and h2.accept() == "accepted"
