"""The A2A adapter carries the A2A message's messageId as the envelope's `message_id`
(`handoff.message.id` on the create): on the client (the message that starts the task) and
on the server for a client without the interceptor (the task's first message)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("a2a")

from a2a.client.interceptors import BeforeArgs
from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import AgentCard, Message, Role, SendMessageRequest, TaskState

from collector import InMemoryRecorder, semconv
from collector.adapters.a2a import METADATA_KEY, A2AServerObserver, HandoffClientInterceptor


def _message() -> Message:
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[new_text_part("go")])


def test_the_client_sends_the_message_id_in_the_envelope():
    rec = InMemoryRecorder()
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider)
    msg = _message()
    args = BeforeArgs(input=SendMessageRequest(message=msg), method="send_message",
                      agent_card=AgentCard(name="coder"))  # fmt: skip
    asyncio.run(icpt.before(args))
    (create,) = rec.transitions()
    assert create[semconv.MESSAGE_ID] == msg.message_id
    assert json.loads(args.input.message.metadata[METADATA_KEY])["message_id"] == msg.message_id
    rec.shutdown()


def test_the_server_takes_it_from_an_uninstrumented_clients_first_message():
    rec = InMemoryRecorder()
    obs = A2AServerObserver(agent="coder", tracer_provider=rec.provider)
    store = obs.task_store(InMemoryTaskStore())
    msg = _message()
    task = new_task_from_user_message(msg)
    task.status.state = TaskState.TASK_STATE_SUBMITTED
    asyncio.run(store.save(task, ServerCallContext()))
    (create,) = rec.transitions()
    assert create[semconv.MESSAGE_ID] == msg.message_id
    rec.shutdown()
