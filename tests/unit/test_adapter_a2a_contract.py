"""The A2A adapter carries the checks it can see: the client declares must_return and the
evidence policy on every envelope, the server records the fields of the artifacts'
structured parts on the commit (the SDK's own proto objects, no network)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("a2a")

from a2a.client.interceptors import BeforeArgs
from a2a.helpers import new_task_from_user_message, new_text_artifact, new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    AgentCard,
    Artifact,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from google.protobuf import struct_pb2

from collector import EnvelopeError, EvidencePolicy, InMemoryRecorder
from collector import semconv as sc
from collector.adapters.a2a import METADATA_KEY, A2AServerObserver, HandoffClientInterceptor

POLICY = {"valid_after": "2026-12-01T00:00:00Z", "min_refs": 1, "require_claims": True}


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def _message() -> Message:
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[new_text_part("go")])


def _data_artifact(artifact_id: str, **fields) -> Artifact:
    value = struct_pb2.Value()
    value.struct_value.update(fields)
    return Artifact(artifact_id=artifact_id, parts=[Part(data=value)])


def _complete(rec, task, *artifacts) -> dict:
    store = A2AServerObserver(agent="coder", tracer_provider=rec.provider).task_store(
        InMemoryTaskStore()
    )
    task.status.state = TaskState.TASK_STATE_COMPLETED
    for a in artifacts:
        task.artifacts.append(a)
    asyncio.run(store.save(task, ServerCallContext()))
    return rec.transitions()[-1]


def test_the_commit_lists_the_fields_of_structured_artifacts(rec):
    commit = _complete(
        rec,
        new_task_from_user_message(_message()),
        _data_artifact("a1", answer="42", sources=["doc:1"]),
        new_text_artifact("notes", "text", artifact_id="a2"),
        _data_artifact("a3", answer="42", cost=1),
    )
    assert commit[sc.EVENT] == "commit"
    assert commit[sc.RESULT_FIELDS] == ("answer", "cost", "sources")


def test_a_text_only_result_shows_no_fields(rec):
    commit = _complete(
        rec,
        new_task_from_user_message(_message()),
        new_text_artifact("notes", "text", artifact_id="a1"),
    )
    assert commit[sc.EVENT] == "commit" and sc.RESULT_FIELDS not in commit


def test_the_client_declares_the_checks_and_the_server_reads_them(rec):
    icpt = HandoffClientInterceptor(
        actor="planner",
        tracer_provider=rec.provider,
        must_return=["answer", "sources"],
        evidence_policy=POLICY,
    )
    args = BeforeArgs(input=SendMessageRequest(message=_message()), method="send_message",
                      agent_card=AgentCard(name="coder"))  # fmt: skip
    asyncio.run(icpt.before(args))
    (create,) = rec.transitions()
    assert create[sc.REPLY_CONTRACT_MUST_RETURN] == ("answer", "sources")
    assert create[sc.EVIDENCE_POLICY_MIN_REFS] == 1
    assert create[sc.EVIDENCE_POLICY_REQUIRE_CLAIMS] is True
    wire = json.loads(args.input.message.metadata[METADATA_KEY])
    assert (wire["must_return"], wire["evidence_policy"]) == (["answer", "sources"], POLICY)
    commit = _complete(
        rec,
        new_task_from_user_message(args.input.message),
        _data_artifact("a1", answer="42"),
    )
    assert commit[sc.HANDOFF_ID] == create[sc.HANDOFF_ID]
    assert commit[sc.RESULT_FIELDS] == ("answer",)


def test_a_bad_declaration_is_refused_at_construction(rec):
    with pytest.raises(EnvelopeError, match="min_refs"):
        HandoffClientInterceptor(
            actor="p", tracer_provider=rec.provider, evidence_policy={"min_refs": -1}
        )
    with pytest.raises(EnvelopeError, match="must_return"):
        HandoffClientInterceptor(actor="p", tracer_provider=rec.provider, must_return="answer")
    ok = HandoffClientInterceptor(
        actor="p", tracer_provider=rec.provider, evidence_policy=EvidencePolicy(min_refs=0)
    )
    assert ok is not None
