"""Every adapter's `create` carries `handoff.payload_hash` from what the adapter saw, so a
keyless write sent twice (keyless_duplicate_write) or a key reused with another payload
(idempotency_conflict) is told apart without the emitter's help: the A2A client hashes its
outgoing message's parts, the A2A server the task's first message (the same digest for the
same parts), the OpenAI Agents processor the handed-over history or the shim's default."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from collector import InMemoryRecorder


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def _creates(rec) -> list[dict]:
    return [t for t in rec.transitions() if t["handoff.event"] == "create"]


def test_a2a_client_and_server_hash_the_message_parts(rec):
    pytest.importorskip("a2a")
    from a2a.client.interceptors import BeforeArgs
    from a2a.helpers import new_task_from_user_message, new_text_part
    from a2a.server.context import ServerCallContext
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types.a2a_pb2 import AgentCard, Message, Role, SendMessageRequest, TaskState

    from collector.adapters._a2a_client import parts_payload_hash
    from collector.adapters.a2a import A2AServerObserver, HandoffClientInterceptor

    def message(text: str) -> Message:
        return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                       parts=[new_text_part(text)])  # fmt: skip

    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider)
    sent = [message("refund order 42"), message("refund order 42"), message("refund order 43")]
    for m in sent:
        asyncio.run(icpt.before(BeforeArgs(input=SendMessageRequest(message=m),
                                           method="send_message", agent_card=AgentCard(name="billing"))))  # fmt: skip
    client = [c["handoff.payload_hash"] for c in _creates(rec)]
    assert client[0] == client[1] != client[2] and client[0] == parts_payload_hash(sent[0])
    # a client without the interceptor: the server creates the handoff from the first message
    store = A2AServerObserver(agent="billing", tracer_provider=rec.provider).task_store(
        InMemoryTaskStore()
    )
    task = new_task_from_user_message(message("refund order 42"))
    task.status.state = TaskState.TASK_STATE_SUBMITTED
    asyncio.run(store.save(task, ServerCallContext()))
    server = _creates(rec)[-1]
    assert server["handoff.from_agent"] == "a2a-client"
    assert server["handoff.payload_hash"] == client[0]


def test_openai_agents_creates_carry_a_payload_hash(rec):
    pytest.importorskip("agents")
    from agents import Agent, Runner, set_trace_processors

    from collector.adapters.openai_agents import HandoffTracingProcessor
    from collector.adapters.openai_agents_testing import ScriptedModel

    p = HandoffTracingProcessor(tracer_provider=rec.provider, deadline_ms=60_000)
    set_trace_processors([p])
    try:
        coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
        planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
        asyncio.run(Runner.run(planner, "fix bug 12"))
    finally:
        set_trace_processors([])
    (create,) = _creates(rec)
    assert create["handoff.payload_hash"].startswith("sha256:")
