"""The a2a-sdk's refusals mapped onto the error-code vocabulary: the table over the SDK's own
error classes, and the observer's / interceptor's `reject` with the real DefaultRequestHandler
and the SDK's proto messages (no network)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("a2a")

from a2a.client import errors as client_errors
from a2a.client.interceptors import BeforeArgs
from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import AgentCard, Message, Role, SendMessageRequest
from a2a.utils import errors

from collector import InMemoryRecorder, semconv
from collector.a2a import A2A_ERROR_CODES, a2a_error_code
from collector.adapters.a2a import METADATA_KEY, A2AServerObserver, HandoffClientInterceptor

CTX = ServerCallContext()
CARD = AgentCard(name="coder", default_input_modes=["text/plain"])


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.VersionNotSupportedError(), "incompatible_protocol"),
        (errors.ExtensionSupportRequiredError(), "incompatible_protocol"),
        (errors.ContentTypeNotSupportedError(), "incompatible_protocol"),
        (errors.InvalidParamsError(), "invalid_envelope"),
        (errors.InvalidRequestError(), "invalid_envelope"),
        (errors.JSONParseError(), "invalid_envelope"),
        (errors.TaskNotFoundError(), "invalid_envelope"),
        (errors.UnsupportedOperationError(), "unknown_capability"),
        (errors.MethodNotFoundError(), "unknown_capability"),
        (errors.PushNotificationNotSupportedError(), "unknown_capability"),
        (errors.ExtendedAgentCardNotConfiguredError(), "unknown_capability"),
        (errors.TaskNotCancelableError(), "conflict"),
        (client_errors.A2AClientTimeoutError("timed out"), "deadline"),
        (client_errors.A2AClientError("HTTP Error 401: Unauthorized"), "permission_denied"),
        (client_errors.A2AClientError("HTTP Error 403: Forbidden"), "permission_denied"),
        (client_errors.A2AClientError("HTTP Error 429: Too Many Requests"), "busy"),
        (client_errors.A2AClientError("HTTP Error 503: Unavailable"), "busy"),
        (client_errors.AgentCardResolutionError("no card", status_code=403), "permission_denied"),
        # not refusals of the request: a code of their own, kept as sent
        (errors.InternalError(), "a2a_internal"),
        (errors.InvalidAgentResponseError(), "a2a_invalid_agent_response"),
        (client_errors.A2AClientError("HTTP Error 500: boom"), "a2a_client"),
        (ValueError("x"), "a2a_value"),
    ],
)
def test_each_sdk_error_maps_to_the_nearest_code(error, code):
    assert a2a_error_code(error) == code


def test_the_table_names_real_sdk_classes_and_documented_codes():
    sdk = {n for n in dir(errors) if isinstance(getattr(errors, n), type)}
    sdk |= {n for n in dir(client_errors) if isinstance(getattr(client_errors, n), type)}
    assert set(A2A_ERROR_CODES) <= sdk
    assert set(A2A_ERROR_CODES.values()) <= set(semconv.ERROR_CODES)


def _message(*, media_type: str = "", metadata: dict | None = None) -> Message:
    part = new_text_part("go")
    if media_type:
        part.media_type = media_type
    m = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[part])
    for k, v in (metadata or {}).items():
        m.metadata[k] = v
    return m


def _client_message(rec, **kw) -> tuple[HandoffClientInterceptor, Message]:
    icpt = HandoffClientInterceptor(actor="planner", tracer_provider=rec.provider)
    args = BeforeArgs(input=SendMessageRequest(message=_message(**kw)), method="send_message",
                      agent_card=CARD)  # fmt: skip
    asyncio.run(icpt.before(args))
    return icpt, args.input.message


def _handler(rec):
    obs = A2AServerObserver(agent="coder", tracer_provider=rec.provider)
    store = obs.task_store(InMemoryTaskStore())
    inner = DefaultRequestHandler(None, store, CARD, validate_input_modes=True)  # type: ignore[arg-type]  # no executor: never reached
    return obs, obs.request_handler(inner)


def test_server_refusing_a_message_rejects_the_handoff_it_would_start(rec):
    _, msg = _client_message(rec, media_type="image/png")
    obs, handler = _handler(rec)
    with pytest.raises(errors.ContentTypeNotSupportedError):
        asyncio.run(handler.on_message_send(SendMessageRequest(message=msg), CTX))
    create, reject = rec.transitions()
    assert (create[semconv.EVENT], create[semconv.ACTOR]) == ("create", "planner")
    assert (reject[semconv.EVENT], reject[semconv.ACTOR]) == ("reject", "coder")
    assert reject[semconv.HANDOFF_ID] == create[semconv.HANDOFF_ID]
    assert reject[semconv.ERROR_CODE] == "incompatible_protocol"
    assert len({s.context.trace_id for s in rec.spans()}) == 1  # in the client's trace
    assert (obs.errors, obs.refused) == (0, 0)


def test_server_receiving_a_v2_envelope_rejects_it_as_incompatible(rec):
    _, msg = _client_message(rec, media_type="image/png")
    wire = json.loads(msg.metadata[METADATA_KEY])
    msg.metadata[METADATA_KEY] = json.dumps({**wire, "protocol": "aa-handoff/v2"})
    obs, handler = _handler(rec)
    with pytest.raises(errors.ContentTypeNotSupportedError):
        asyncio.run(handler.on_message_send(SendMessageRequest(message=msg), CTX))
    reject = rec.transitions()[-1]
    assert reject[semconv.EVENT] == "reject"
    assert reject[semconv.ERROR_CODE] == "incompatible_protocol"
    assert [t[semconv.EVENT] for t in rec.transitions()] == ["create", "reject"]
    assert obs.errors == 0


def test_a_message_without_an_envelope_names_no_handoff_and_records_nothing(rec):
    obs, handler = _handler(rec)
    with pytest.raises(errors.ContentTypeNotSupportedError):
        asyncio.run(
            handler.on_message_send(SendMessageRequest(message=_message(media_type="x/y")), CTX)
        )
    assert rec.transitions() == [] and obs.errors == 0


def test_client_records_a_refusal_of_a_server_without_the_observer(rec):
    icpt, msg = _client_message(rec)
    code = icpt.record_refusal(msg.message_id, errors.UnsupportedOperationError())
    assert code == "unknown_capability"
    create, reject = rec.transitions()
    assert (reject[semconv.EVENT], reject[semconv.ACTOR]) == ("reject", "planner")
    assert reject[semconv.ERROR_CODE] == "unknown_capability"
    assert reject[semconv.HANDOFF_ID] == create[semconv.HANDOFF_ID]
    # once only, and never for a message this client did not start a handoff with
    assert icpt.record_refusal(msg.message_id, errors.UnsupportedOperationError()) is None
    assert icpt.record_refusal("unknown-message", errors.TaskNotFoundError()) is None
    assert len(rec.transitions()) == 2


def test_a_task_whose_envelope_the_server_refuses_is_rejected_once(rec):
    from a2a.helpers import new_task_from_user_message
    from a2a.types.a2a_pb2 import TaskState

    _, msg = _client_message(rec)
    wire = json.loads(msg.metadata[METADATA_KEY])
    del wire["mode"]
    msg.metadata[METADATA_KEY] = json.dumps(wire)
    obs = A2AServerObserver(agent="coder", tracer_provider=rec.provider)
    store = obs.task_store(InMemoryTaskStore())
    task = new_task_from_user_message(msg)

    async def walk():
        for state in ("SUBMITTED", "WORKING", "COMPLETED"):
            task.status.state = getattr(TaskState, f"TASK_STATE_{state}")
            await store.save(task, CTX)

    asyncio.run(walk())
    events = [(t[semconv.EVENT], t.get(semconv.ERROR_CODE)) for t in rec.transitions()]
    assert events == [("create", None), ("reject", "missing_required_field")]
    assert (obs.refused, obs.errors) == (1, 0)


def test_the_developer_guide_table_matches_the_mapping():
    from pathlib import Path

    from collector.a2a import A2A_HTTP_CODES

    doc = Path(__file__).resolve().parents[2] / "docs" / "agent-developers.md"
    rows = [r for r in doc.read_text(encoding="utf-8").splitlines() if r.startswith("| ")]
    for name, code in A2A_ERROR_CODES.items():
        assert any(f"`{name}`" in r and r.endswith(f"| `{code}` |") for r in rows), name
    for status, code in A2A_HTTP_CODES.items():
        assert any(str(status) in r and r.endswith(f"| `{code}` |") for r in rows), status
