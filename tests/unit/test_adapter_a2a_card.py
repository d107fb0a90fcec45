"""The A2A client interceptor records the Agent Card a handoff goes to (real a2a-sdk types,
in-memory recorder)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("a2a")

from a2a.client.interceptors import BeforeArgs
from a2a.types import AgentCard, AgentInterface, AgentSkill, SendMessageRequest

from collector import InMemoryRecorder, semconv
from collector.adapters.a2a import HandoffClientInterceptor
from tests.unit.test_adapter_a2a_offline import _message

NS0 = 1_796_119_200_000_000_000  # 2026-12-01T10:00:00Z
CARD = AgentCard(
    name="coder",
    supported_interfaces=[AgentInterface(url="https://coder.example/a2a")],
    skills=[AgentSkill(id="code.write", name="write"), AgentSkill(id="code.review", name="rv")],
)


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def _send(icpt, card):
    args = BeforeArgs(input=SendMessageRequest(message=_message()), method="send_message",
                      agent_card=card)  # fmt: skip
    asyncio.run(icpt.before(args))


def test_the_card_is_recorded_first_seen_when_no_fetch_time_is_given(rec):
    ticks = iter([NS0, NS0 + 1, NS0 + 3_600 * 10**9, NS0 + 3_600 * 10**9 + 1])
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider,
                                    clock=lambda: next(ticks))  # fmt: skip
    _send(icpt, CARD)
    _send(icpt, CARD)  # an hour later: the same card, seen first an hour ago
    first, second = rec.transitions()
    for t in (first, second):
        assert t[semconv.AGENT_CARD_URL] == "https://coder.example/a2a"
        assert t[semconv.AGENT_CARD_SKILLS] == ("code.write", "code.review")
        assert t[semconv.AGENT_CARD_FETCHED_AT] == "2026-12-01T10:00:00Z"


def test_a_given_fetch_time_wins_and_a_card_without_url_records_nothing(rec):
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider,
                                    card_fetched_at="2026-11-30T08:00:00Z")  # fmt: skip
    _send(icpt, CARD)
    _send(icpt, AgentCard(name="coder"))
    with_card, without = rec.transitions()
    assert with_card[semconv.AGENT_CARD_FETCHED_AT] == "2026-11-30T08:00:00Z"
    assert semconv.AGENT_CARD_URL not in without
    with pytest.raises(ValueError, match="fetched_at: not an ISO-8601 UTC time"):
        HandoffClientInterceptor(actor="p", tracer_provider=rec.provider,
                                 card_fetched_at="yesterday")  # fmt: skip
