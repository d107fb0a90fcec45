"""A2A adapter without a network: the observer driven through its real store/handler wrappers
with the SDK's own proto objects and InMemoryTaskStore, the interceptor with BeforeArgs."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("a2a")

from a2a.client.interceptors import AfterArgs, BeforeArgs
from a2a.helpers import new_task_from_user_message, new_text_artifact, new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    AgentCard,
    Message,
    Role,
    SendMessageRequest,
    SendMessageResponse,
    TaskState,
)

from collector import InMemoryRecorder
from collector.adapters.a2a import (
    METADATA_KEY,
    STATUS_CODE_KEY,
    A2AServerObserver,
    HandoffClientInterceptor,
)

CTX = ServerCallContext()


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def _message(text="go", task_id="", metadata=None):
    m = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                parts=[new_text_part(text)], task_id=task_id)  # fmt: skip
    for k, v in (metadata or {}).items():
        m.metadata[k] = v
    return m


def _server(rec, **kw):
    obs = A2AServerObserver(agent="coder", tracer_provider=rec.provider, **kw)
    return obs, obs.task_store(InMemoryTaskStore())


def _walk(store, task, *states, artifacts=0):
    async def go():
        for st in states:
            task.status.state = getattr(TaskState, f"TASK_STATE_{st}")
            if st == "COMPLETED":
                for i in range(artifacts):
                    task.artifacts.append(new_text_artifact(f"a{i}", "text", artifact_id=f"art{i}"))
            await store.save(task, CTX)

    asyncio.run(go())


def _events(rec, **where):
    return [
        (t["handoff.event"], t.get("handoff.error_code"))
        for t in rec.transitions()
        if all(t.get(k) == v for k, v in where.items())
    ]


def test_uninstrumented_task_lifecycle_including_cancel(rec):
    obs, store = _server(rec)
    task = new_task_from_user_message(_message())
    _walk(store, task, "SUBMITTED", "WORKING", "INPUT_REQUIRED", "WORKING", "CANCELED")
    assert _events(rec) == [("create", None), ("accept", None), ("start", None),
                            ("cancel", "a2a_canceled")]  # fmt: skip
    create = rec.transitions()[0]
    assert create["handoff.handoff_id"] == task.id
    assert create["handoff.task_id"] == task.context_id
    assert (create["handoff.from_agent"], create["handoff.to_agent"]) == ("a2a-client", "coder")
    assert create["handoff.topology"] == "federated_a2a"
    assert (obs.errors, obs.refused) == (0, 0)


def test_completed_carries_artifacts_as_evidence_and_skipped_steps_are_walked(rec):
    _, store = _server(rec)
    task = new_task_from_user_message(_message())
    _walk(store, task, "COMPLETED", artifacts=2)  # never seen working: steps implied
    assert [e for e, _ in _events(rec)] == ["create", "accept", "start", "commit"]
    commit = rec.transitions()[-1]
    assert commit["handoff.evidence.count"] == 2 and commit["handoff.evidence.valid"] is True
    assert commit["handoff.evidence_refs"] == ("a2a-artifact:art0", "a2a-artifact:art1")
    assert commit["handoff.receipt.status"] == "completed"


def test_rejected_and_failed_error_codes(rec):
    """A task the agent rejects is the refusal of the skill asked for (`unknown_capability`,
    what the Agent Card checks read) unless the agent names its reason on the status message."""
    _, store = _server(rec)
    rejected = new_task_from_user_message(_message())
    failed = new_task_from_user_message(_message())
    busy = new_task_from_user_message(_message())
    _walk(store, rejected, "SUBMITTED", "REJECTED")
    _walk(store, failed, "SUBMITTED", "WORKING", "FAILED")
    busy.status.message.CopyFrom(_message("later", metadata={STATUS_CODE_KEY: "busy"}))
    _walk(store, busy, "REJECTED")
    assert _events(rec, **{"handoff.handoff_id": rejected.id})[-1] == (
        "reject", "unknown_capability")  # fmt: skip
    assert _events(rec, **{"handoff.handoff_id": failed.id})[-1] == ("fail", "a2a_failed")
    assert _events(rec, **{"handoff.handoff_id": busy.id})[-1] == ("reject", "busy")


def test_contradicting_state_lenient_flags_strict_refuses(rec):
    lenient, lstore = _server(rec, strict=False)
    t1 = new_task_from_user_message(_message())
    _walk(lstore, t1, "WORKING", "FAILED", "COMPLETED")
    assert lenient.refused == 0
    last = rec.transitions()[-1]
    assert (last["handoff.event"], last["handoff.valid"]) == ("commit", False)
    rec.clear()
    strict, sstore = _server(rec, strict=True)
    t2 = new_task_from_user_message(_message())
    _walk(sstore, t2, "WORKING", "FAILED", "COMPLETED")
    assert [e for e, _ in _events(rec)][-1] == "fail"  # the illegal commit was not emitted
    assert strict.refused == 1 and strict.errors == 0


def test_message_to_terminal_task_rebuilt_from_the_store_after_eviction(rec):
    obs, store = _server(rec, strict=False, max_tracked=1)
    handler = obs.request_handler(DefaultRequestHandler(None, store, AgentCard(name="coder")))  # type: ignore[arg-type]  # no executor: never reached
    done = new_task_from_user_message(_message())
    _walk(store, done, "SUBMITTED", "WORKING", "COMPLETED", artifacts=1)
    other = new_task_from_user_message(_message())
    _walk(store, other, "SUBMITTED")  # evicts `done` from memory
    assert obs.evicted == 1
    trace_of_done = {t.context.trace_id for t in rec.spans()
                     if t.attributes["handoff.handoff_id"] == done.id}  # fmt: skip
    req = SendMessageRequest(message=_message("again", task_id=done.id))
    with pytest.raises(Exception, match="terminal state"):
        asyncio.run(handler.on_message_send(req, CTX))
    last = rec.transitions()[-1]
    assert last["handoff.handoff_id"] == done.id
    assert (last["handoff.event"], last["handoff.from_state"], last["handoff.valid"]) == (
        "reject", "committed", False)  # fmt: skip
    assert (last["handoff.error_code"], last["handoff.actor"]) == ("conflict", "coder")
    assert obs.errors == 0
    assert len(trace_of_done) == 1  # (uninstrumented: the rebuilt handoff has a fresh trace)


def test_a_strict_observer_records_a_message_to_a_finished_task(rec):
    """Strict (the default) no longer drops it: the agent's reject of the message, flagged
    (the handoff stays committed), error_code conflict; nothing counted as dropped."""
    obs, store = _server(rec)
    handler = obs.request_handler(DefaultRequestHandler(None, store, AgentCard(name="coder")))  # type: ignore[arg-type]  # no executor: never reached
    done = new_task_from_user_message(_message())
    _walk(store, done, "SUBMITTED", "WORKING", "COMPLETED", artifacts=1)
    req = SendMessageRequest(message=_message("again", task_id=done.id))
    with pytest.raises(Exception, match="terminal state"):
        asyncio.run(handler.on_message_send(req, CTX))
    last = rec.transitions()[-1]
    assert (last["handoff.event"], last["handoff.from_state"], last["handoff.to_state"],
            last["handoff.valid"], last["handoff.error_code"]) == (
        "reject", "committed", "rejected", False, "conflict")  # fmt: skip
    assert (obs.refused, obs.errors) == (0, 0)


def test_client_interceptor_creates_and_injects(rec):
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider,
                                    deadline_ms=5_000, capabilities=("code.write",))  # fmt: skip
    msg = _message()
    args = BeforeArgs(input=SendMessageRequest(message=msg), method="send_message",
                      agent_card=AgentCard(name="coder"))  # fmt: skip
    asyncio.run(icpt.before(args))
    (create,) = rec.transitions()
    assert create["handoff.event"] == "create" and create["handoff.actor"] == "planner"
    assert create["handoff.to_agent"] == "coder"
    assert create["handoff.capabilities"] == ("code.write",)
    wire = json.loads(args.input.message.metadata[METADATA_KEY])
    assert wire["handoff_id"] == create["handoff.handoff_id"]
    assert args.context is not None and args.context.service_parameters is not None
    assert wire["traceparent"] == args.context.service_parameters["traceparent"]
    # the server's answer binds the A2A task id; a follow-up carries the same traceparent
    task = new_task_from_user_message(args.input.message)
    asyncio.run(icpt.after(AfterArgs(result=SendMessageResponse(task=task), method="send_message",
                                     agent_card=AgentCard(name="coder"))))  # fmt: skip
    follow = BeforeArgs(input=SendMessageRequest(message=_message(task_id=task.id)),
                        method="send_message", agent_card=AgentCard(name="coder"))  # fmt: skip
    asyncio.run(icpt.before(follow))
    assert follow.context is not None and follow.context.service_parameters is not None
    assert follow.context.service_parameters["traceparent"] == wire["traceparent"]
    assert METADATA_KEY not in follow.input.message.metadata
    assert len(rec.transitions()) == 1


def test_server_joins_the_client_wire(rec):
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider)
    args = BeforeArgs(input=SendMessageRequest(message=_message()), method="send_message",
                      agent_card=AgentCard(name="coder"))  # fmt: skip
    asyncio.run(icpt.before(args))
    _, store = _server(rec)
    task = new_task_from_user_message(args.input.message)
    _walk(store, task, "SUBMITTED", "WORKING", "COMPLETED", artifacts=1)
    ts = rec.transitions()
    assert [t["handoff.event"] for t in ts] == ["create", "accept", "start", "commit"]
    assert len({t["handoff.handoff_id"] for t in ts}) == 1
    assert len({s.context.trace_id for s in rec.spans()}) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mode": "x"}, "mode"), ({"max_tracked": 0}, "max_tracked")],
)
def test_observer_bad_arguments(rec, kwargs, field):
    with pytest.raises(ValueError, match=field):
        A2AServerObserver(agent="coder", tracer_provider=rec.provider, **kwargs)


def test_wrappers_refuse_wrong_types(rec):
    obs = A2AServerObserver(agent="coder", tracer_provider=rec.provider)
    with pytest.raises(TypeError, match="TaskStore"):
        obs.task_store(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RequestHandler"):
        obs.request_handler(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline_ms"):
        HandoffClientInterceptor(actor="p", tracer_provider=rec.provider, deadline_ms=-1)


def test_lazy_names_on_the_adapters_package():
    import collector.adapters as adapters
    from collector.adapters import a2a

    # the face has no TYPE_CHECKING imports (each name needs an extra): unknown to mypy
    assert adapters.A2AServerObserver is a2a.A2AServerObserver  # type: ignore[attr-defined]
    assert adapters.HandoffClientInterceptor is a2a.HandoffClientInterceptor  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="nope"):
        _ = adapters.nope  # type: ignore[attr-defined]
