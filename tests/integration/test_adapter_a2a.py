"""A2A SDK server + client, instrumented, -> real OTLP exporter -> `handoffs serve` -> analytics.

A real A2A Starlette app (the SDK's JSON-RPC routes) served by uvicorn on a free loopback
port in a thread, the SDK's client with our interceptor, our observer on the server's task
store and request handler. Both sides export through the OTel SDK's OTLP/HTTP exporter to a
serve subprocess; results are read through serve's ClickHouse HTTP port with the analytics API.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("a2a")

import uvicorn
from a2a.client import ClientConfig, create_client
from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import UnsupportedOperationError
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from starlette.applications import Starlette

import analytics
from analytics.refusals import refusals
from collector.adapters.a2a import A2AServerObserver, HandoffClientInterceptor
from serve.testing import free_port, wait_until


class ScriptedExecutor(AgentExecutor):
    """Does what the message text says: complete | fail | reject | input (then complete)."""

    async def execute(self, context, event_queue):
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        u = TaskUpdater(event_queue, context.task_id, context.context_id)
        text = context.message.parts[0].text
        if text == "reject":
            await u.reject()
            return
        await u.start_work()
        if text == "fail":
            await u.failed()
        elif text == "input":
            await u.requires_input()
        else:  # complete, and the answer to input-required
            await u.add_artifact([new_text_part("the patch")], name="patch")
            await u.complete()

    async def cancel(self, context, event_queue):
        u = TaskUpdater(event_queue, context.task_id, context.context_id)
        await u.cancel()


def _provider(serve, service):
    p = TracerProvider(resource=Resource.create({"service.name": service}))
    p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")))
    return p


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("adapter-a2a"))
    yield s
    s.stop()


def _coder_server(serve, service: str, *, strict: bool):
    """Yields (url, observer): the coder agent's A2A server on a loopback port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="coder",
        description="writes patches",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(protocol_binding="JSONRPC", url=f"{url}/", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="code.write", name="code", description="code", tags=["code"])],
    )
    provider = _provider(serve, service)
    observer = A2AServerObserver(agent="coder", tracer_provider=provider, strict=strict)
    store = observer.task_store(InMemoryTaskStore())
    handler = observer.request_handler(DefaultRequestHandler(ScriptedExecutor(), store, card))
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start")
    assert thread.is_alive(), "uvicorn thread died"
    yield url, observer
    server.should_exit = True
    thread.join(30)
    provider.shutdown()


@pytest.fixture(scope="module")
def a2a_server(serve):
    """(url, observer): the coder agent's A2A server, observed leniently."""
    yield from _coder_server(serve, "coder-a2a", strict=False)


@pytest.fixture(scope="module")
def strict_server(serve):
    """(url, observer): the same agent observed strictly (the observer's default)."""
    yield from _coder_server(serve, "coder-a2a-strict", strict=True)


def _client(serve, url, observer, service="planner"):
    """send(text, task_id=None) -> Task, on a client instrumented as `planner`."""
    provider = _provider(serve, service)
    interceptor = HandoffClientInterceptor(
        actor="planner", tracer_provider=provider, deadline_ms=60_000, capabilities=("code.write",)
    )

    async def _send(text, task_id, streaming):
        config = ClientConfig(streaming=streaming)
        client = await create_client(url, config, interceptors=[interceptor])
        try:
            msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                          parts=[new_text_part(text)], task_id=task_id or "")  # fmt: skip
            last = None
            async for ev in client.send_message(SendMessageRequest(message=msg)):
                if ev.HasField("task"):
                    last = ev.task
                elif ev.HasField("status_update"):  # streaming: the latest status
                    assert last is not None, "a status update before its task"
                    last.status.CopyFrom(ev.status_update.status)
            return last
        finally:
            await client.close()

    def send(text, task_id=None, *, streaming=False):
        return asyncio.run(_send(text, task_id, streaming))

    return send, interceptor, observer, provider


@pytest.fixture
def client_side(serve, a2a_server):
    """send(text, task_id=None) -> Task, on a client instrumented as `planner`."""
    send, interceptor, observer, provider = _client(serve, *a2a_server)
    yield send, interceptor, observer
    provider.shutdown()


def _window_since(start):
    return analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))


def _funnel(serve, window, **kw):
    with serve.client() as c:
        return analytics.funnel(c, database=serve.database, window=window, **kw).iloc[0]


def _rows(serve, hid):
    with serve.client() as c:
        return c.query(
            "SELECT event, from_state, to_state, actor, valid, error_code, trace_id "
            f"FROM {serve.database}.handoff_transitions WHERE handoff_id = {{h:String}} "
            "ORDER BY time, indexOf(['create', 'accept', 'start', 'commit'], event)",
            parameters={"h": hid},
        ).result_rows


def test_completed_task_is_one_committed_handoff(serve, client_side):
    send, interceptor, observer = client_side
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    task = send("complete")
    assert TaskState.Name(task.status.state) == "TASK_STATE_COMPLETED"
    serve.wait_stored()
    window = _window_since(start)
    row = _funnel(serve, window)
    assert (row["volume"], row["settled"], row["committed"], row["evidenced"]) == (1, 1, 1, 1)
    assert row["p_e2e"] == 1.0
    hid = interceptor.handoffs[task.id].handoff_id
    rows = _rows(serve, hid)
    assert [r[0] for r in rows] == ["create", "accept", "start", "commit"]
    assert [r[3] for r in rows] == ["planner", "coder", "coder", "coder"]
    assert len({r[6] for r in rows}) == 1  # the client's trace, joined by the server
    with serve.client() as c:
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert pkg["anomalies"] == []
    assert pkg["envelope"]["topology"] == "federated_a2a"
    assert pkg["envelope"]["to_agent"] == "coder"
    assert pkg["terminal"]["state"] == "committed"
    assert pkg["evidence_refs"] and pkg["evidence_refs"][0].startswith("a2a-artifact:")
    assert observer.errors == 0


def test_failed_rejected_and_input_required_lifecycles(serve, client_side):
    send, interceptor, observer = client_side
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    failed = send("fail")
    rejected = send("reject")
    waiting = send("input")
    assert TaskState.Name(waiting.status.state) == "TASK_STATE_INPUT_REQUIRED"
    resumed = send("complete", task_id=waiting.id)
    assert TaskState.Name(resumed.status.state) == "TASK_STATE_COMPLETED"
    serve.wait_stored()
    events = {
        name: [r[0] for r in _rows(serve, interceptor.handoffs[t.id].handoff_id)]
        for name, t in (("failed", failed), ("rejected", rejected), ("resumed", waiting))
    }
    assert events == {
        "failed": ["create", "accept", "start", "fail"],
        "rejected": ["create", "reject"],
        "resumed": ["create", "accept", "start", "commit"],  # input-required stays running
    }
    row = _funnel(serve, _window_since(start))
    assert (row["settled"], row["accepted"], row["executed"], row["committed"]) == (3, 2, 1, 1)
    assert observer.errors == 0


def _refused_message(serve, send, interceptor, observer, streaming: bool) -> str:
    """A message to a finished task: the SDK refuses it; the observer records the agent's
    reject of it (flagged invalid, error_code conflict), counted in `handoffs refusals`
    and as invalid_transition; the handoff stays committed. Returns the handoff id."""
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    done = send("complete", streaming=streaming)
    assert TaskState.Name(done.status.state) == "TASK_STATE_COMPLETED"
    with pytest.raises(UnsupportedOperationError, match="terminal state"):
        send("complete", task_id=done.id, streaming=streaming)  # the SDK refuses; recorded
    serve.wait_stored()
    hid = interceptor.handoffs[done.id].handoff_id
    rows = _rows(serve, hid)
    assert [r[:6] for r in rows[-2:]] == [
        ("commit", "running", "committed", "coder", True, ""),
        ("reject", "committed", "rejected", "coder", False, "conflict"),
    ]
    assert len({r[6] for r in rows}) == 1  # in the client's trace
    window = _window_since(start)
    with serve.client() as c:
        an = analytics.anomalies(c, database=serve.database, window=window)
        refused = refusals(c, database=serve.database, window=window)
        row = analytics.funnel(c, database=serve.database, window=window).iloc[0]
    invalid = an.set_index("kind").loc["invalid_transition"]
    assert invalid["count"] == 1 and invalid["examples"] == [hid]
    assert [(r.event, r.error_code, r.count, r.examples) for r in refused] == [
        ("reject", "conflict", 1, (hid,))
    ]
    assert (row["committed"], row["outcome_rejected"]) == (1, 0)  # the outcome stands
    assert (observer.errors, observer.refused) == (0, 0)
    return hid


def test_message_to_terminal_task_is_a_flagged_reject(serve, client_side):
    send, interceptor, observer = client_side
    _refused_message(serve, send, interceptor, observer, streaming=True)


def test_a_strict_observer_records_the_refused_message_too(serve, strict_server):
    """Strict (the default) used to drop it, counting it in memory only: now stored."""
    url, strict_observer = strict_server
    send, interceptor, observer, provider = _client(serve, url, strict_observer, "planner-strict")
    try:
        _refused_message(serve, send, interceptor, observer, streaming=False)
    finally:
        provider.shutdown()


def test_a_rejected_task_on_a_fresh_card_that_lists_the_skill(serve, client_side):
    """The agent rejects the task: `unknown_capability`, which the card checks read; the
    client's card was fetched just now and lists code.write: card_skill_refused."""
    send, interceptor, _observer = client_side
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    rejected = send("reject")
    done = send("complete")
    serve.wait_stored()
    hid = interceptor.handoffs[rejected.id].handoff_id
    assert [r[:6] for r in _rows(serve, hid)][-1] == (
        "reject", "created", "rejected", "coder", True, "unknown_capability")  # fmt: skip
    with serve.client() as c:
        an = analytics.anomalies(c, database=serve.database, window=_window_since(start),
                                 kinds=["stale_agent_card", "card_skill_refused"])  # fmt: skip
    assert {r.kind: r.examples for r in an.itertuples()} == {
        "stale_agent_card": [],
        "card_skill_refused": [hid],
    }
    assert interceptor.handoffs[done.id].handoff_id != hid


def test_client_without_interceptor_joins_by_traceparent_header(serve, a2a_server):
    """An uninstrumented client: the server creates the handoff (id = the A2A task id) in the
    trace named by the traceparent header."""
    from a2a.client.client import ClientCallContext

    url, _observer = a2a_server
    trace_id = uuid.uuid4().hex
    header = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"

    async def go():
        client = await create_client(url, ClientConfig(streaming=False))
        try:
            msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                          parts=[new_text_part("complete")])  # fmt: skip
            ctx = ClientCallContext(service_parameters={"traceparent": header})
            async for ev in client.send_message(SendMessageRequest(message=msg), context=ctx):
                return ev.task
        finally:
            await client.close()

    task = asyncio.run(go())
    serve.wait_stored()
    rows = _rows(serve, task.id)
    assert [r[0] for r in rows] == ["create", "accept", "start", "commit"]
    assert {r[3] for r in rows} == {"coder"}
    assert {r[6] for r in rows} == {trace_id}
    with serve.client() as c:
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=task.id)
        assert pkg is not None
    assert pkg["envelope"]["from_agent"] == "a2a-client"
    assert pkg["envelope"]["task_id"] == task.context_id


@pytest.fixture
def media_checking_server(serve):
    """(url, observer): a coder server that takes text/plain only (the SDK checks the parts)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="coder",
        description="writes patches",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(protocol_binding="JSONRPC", url=f"{url}/", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="code.write", name="code", description="code", tags=["code"])],
    )
    provider = _provider(serve, "coder-a2a-modes")
    observer = A2AServerObserver(agent="coder", tracer_provider=provider)
    store = observer.task_store(InMemoryTaskStore())
    inner = DefaultRequestHandler(ScriptedExecutor(), store, card, validate_input_modes=True)
    handler = observer.request_handler(inner)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start")
    assert thread.is_alive(), "uvicorn thread died"
    yield url, observer
    server.should_exit = True
    thread.join(30)
    provider.shutdown()


def test_a_message_the_server_refuses_is_a_reject_with_the_mapped_code(
    serve, media_checking_server
):
    """Over real HTTP: the SDK refuses an image for a text/plain agent; the server's observer
    rejects the handoff the client created (incompatible_protocol), in the client's trace,
    and the error the client receives maps to the same code."""
    from a2a.utils.errors import ContentTypeNotSupportedError

    from collector.a2a import a2a_error_code

    url, observer = media_checking_server
    provider = _provider(serve, "planner-modes")
    interceptor = HandoffClientInterceptor(actor="planner", tracer_provider=provider)
    part = new_text_part("see the screenshot")
    part.media_type = "image/png"
    msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[part])

    async def go():
        client = await create_client(url, ClientConfig(streaming=False),
                                     interceptors=[interceptor])  # fmt: skip
        try:
            async for _ev in client.send_message(SendMessageRequest(message=msg)):
                pass
        finally:
            await client.close()

    with pytest.raises(ContentTypeNotSupportedError) as ei:
        asyncio.run(go())
    assert a2a_error_code(ei.value) == "incompatible_protocol"
    provider.shutdown()
    serve.wait_stored()
    with serve.client() as c:
        rows = c.query(
            "SELECT event, actor, error_code, valid, trace_id "
            f"FROM {serve.database}.handoff_transitions WHERE handoff_id = {{h:String}} "
            "ORDER BY time",
            parameters={"h": f"a2a-{msg.message_id}"},
        ).result_rows
    assert [r[:4] for r in rows] == [
        ("create", "planner", "", True),
        ("reject", "coder", "incompatible_protocol", True),
    ]
    assert len({r[4] for r in rows}) == 1
    assert (observer.errors, observer.refused) == (0, 0)
