"""A2A SDK adapter: A2A task lifecycles become handoff transitions (topology federated_a2a).

Server side, `A2AServerObserver(agent=..., tracer_provider=...)` wraps the two extension
points the A2A SDK (1.x) gives a server:
- `observer.task_store(InMemoryTaskStore())`: every task the SDK saves is compared with the
  handoff's state; the A2A state is mapped with `collector.a2a.a2a_events` (the one mapping,
  not repeated here) and each step is emitted through `collector.HandoffTracer`.
- `observer.request_handler(DefaultRequestHandler(executor, store, card))`: sees every
  request first; a message naming a task already in a terminal state is recorded as the
  agent's `reject` of that message (strict or lenient alike: flagged `handoff.valid=false`,
  error_code `conflict`, the state unchanged), then the SDK answers as usual (it refuses).

Client side, `HandoffClientInterceptor(actor=..., tracer_provider=...)` (a
`ClientCallInterceptor`) emits `create` when a message starts a new task, puts the envelope
(JSON, with W3C traceparent) into the message metadata under `aa-handoff`, and sends
`traceparent` as an HTTP header. The server joins the client's trace from the metadata
(or, for a client without this interceptor, from the `traceparent` header, creating the
handoff itself with handoff_id = the A2A task id and from_agent `a2a-client`).
Payload hash: both sides hash the message that starts the task, its parts only
(`parts_payload_hash`: `{"a2a_parts": [...]}`, each part in the protobuf JSON mapping): the
client its outgoing message, the server (creating for a client without the interceptor) the
task's first message. The envelope the interceptor sends carries the hash, so the server's
side of such a handoff agrees with the client's.

| A2A | our transitions |
|---|---|
| message without task id (client) | `create` (actor: the client) |
| task saved `submitted` | nothing (the `create` is the submission) |
| `working`, `input-required`, `auth-required` | `accept`, `start` (once; input-required keeps it running) |
| `completed` | `commit` (+ `accept`, `start` if skipped); evidence = the task's artifacts |
| `failed` / `canceled` | `fail` / `cancel`, error_code `a2a_failed` / `a2a_canceled` |
| `rejected` | `reject`, error_code `unknown_capability` (the agent will not do the skill), or the code the agent put on the status message under `aa-handoff.error_code` |
| message to a task in a terminal state | `reject` from that state, flagged `handoff.valid=false`, error_code `conflict` (both modes) |
| the SDK refuses a message (an `A2AError`) that starts a handoff, or names one still `created` | `reject`, error_code from `collector.a2a.a2a_error_code` (table in docs/agent-developers.md) |
| a message whose `aa-handoff` envelope the server must refuse (v2, field missing, invalid) | `reject` (by `HandoffTracer.receive`), error_code `incompatible_protocol` / `missing_required_field` / `invalid_envelope` |

Evidence on `commit`: `handoff.evidence.count` = number of artifacts, `.valid` = count >= 1,
refs `a2a-artifact:<artifact id>`; `handoff.result.fields` = the keys of the artifacts'
structured (`data`) parts, sorted, when there is one (checked against the
envelope's `must_return`; a text-only result shows no fields). Times: when the observer saw
the save (its clock), not the task's status timestamp: that is stamped earlier by the
executor, on another clock, and mixing the two put `accept` before `create`.
Limits: handoffs are tracked in memory (at most `max_tracked`, oldest evicted and counted in
`evicted`); an evicted or pre-restart task is rebuilt from the task store (its first message's
`aa-handoff` metadata, or the A2A task id). Nothing raises into the SDK: a failure to record
is logged and counted in `errors`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Final

from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.tasks.task_store import TaskStore
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import A2AError
from opentelemetry import context as otel_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from collector._refused import REFUSAL_CODE
from collector.a2a import a2a_error_code, a2a_events, a2a_state_error_code, normalize_a2a_state
from collector.adapters._a2a_client import (
    METADATA_KEY,
    HandoffClientInterceptor,
    parts_payload_hash,
)
from collector.contract import TERMINAL, TRANSITIONS, IllegalTransition, State
from collector.envelope import MODES, Envelope, EnvelopeError
from collector.tracer import HandoffTracer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from collector._redact import InputFilter
    from collector.tracer import Handoff

__all__ = ["METADATA_KEY", "STATUS_CODE_KEY", "A2AServerObserver", "HandoffClientInterceptor"]

_log = logging.getLogger(__name__)

UNKNOWN_CLIENT: Final = "a2a-client"
_PROPAGATOR: Final = TraceContextTextMapPropagator()
_MAX_REFS: Final = 32
_ERROR_EVENTS: Final = frozenset({"reject", "fail", "cancel", "timeout"})
#: status message metadata key under which an agent may name why it ended a task (a
#: `handoff.error_code`: `busy`, `permission_denied`, ...)
STATUS_CODE_KEY: Final = "aa-handoff.error_code"


def _a2a_state(task: Any) -> str:
    return normalize_a2a_state(TaskState.Name(task.status.state))


def _stated_code(task: Any) -> Any:
    """The error code the agent put on the task's status message (STATUS_CODE_KEY), or None."""
    status = task.status
    if not status.HasField("message") or STATUS_CODE_KEY not in status.message.metadata:
        return None
    return status.message.metadata[STATUS_CODE_KEY]


def _message_wire(msg: Any) -> dict[str, Any] | None:
    """The envelope wire a client put in a message's metadata, or None."""
    if METADATA_KEY not in msg.metadata:
        return None
    raw = msg.metadata[METADATA_KEY]
    wire = json.loads(raw) if isinstance(raw, str) else None
    return wire if isinstance(wire, dict) else None


def _wire_of(task: Any) -> dict[str, Any] | None:
    """The envelope wire the client put in the task's first message, or None."""
    for msg in task.history[:1]:
        return _message_wire(msg)
    return None


def _data_fields(artifacts: Any) -> tuple[str, ...] | None:
    """The keys of the artifacts' structured parts (a `data` part holding an object),
    sorted (a protobuf map keeps no order); None when no part is one (the result shows no
    fields)."""
    keys: set[str] = set()
    found = False
    for a in artifacts:
        for part in a.parts:
            if part.HasField("data") and part.data.WhichOneof("kind") == "struct_value":
                found = True
                keys.update(part.data.struct_value.fields)
    return tuple(sorted(keys)) if found else None


def _state_after(a2a_state: str) -> str:
    """Our state a fresh handoff reaches by legal steps toward `a2a_state`."""
    state = str(State.CREATED)
    for ev in a2a_events(a2a_state, state):
        nxt = TRANSITIONS.get((State(state), ev))
        if nxt is None:
            break
        state = str(nxt)
    return state


class A2AServerObserver:
    """Records one A2A agent server's task lifecycles as handoff transitions (module doc).

    `agent`: this server's agent name (the actor; to_agent of handoffs it creates itself).
    `tracer_provider`: OTel TracerProvider (required). `mode`: envelope mode for handoffs the
    server has to create itself (client without the interceptor), default `delegate`.
    `strict`, `input_filter`, `clock`: for the HandoffTracer. `max_tracked`: handoffs kept in
    memory (> 0). Counters: `errors` (failed to record), `refused` (illegal events a strict
    observer did not emit, and tasks whose `aa-handoff` envelope it refused: one `reject`
    each, nothing after), `evicted`. A message to a task in a terminal state is not counted
    there: it is recorded (a flagged `reject`, see the module doc). Raises ValueError on a
    bad argument.
    """

    def __init__(
        self,
        *,
        agent: str,
        tracer_provider: TracerProvider,
        mode: str = "delegate",
        strict: bool = True,
        input_filter: InputFilter | None = None,
        clock: Callable[[], int] | None = None,
        max_tracked: int = 10_000,
    ) -> None:
        if tracer_provider is None:
            raise ValueError("tracer_provider: required (an OTel TracerProvider)")
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {sorted(MODES)}, got {mode!r}")
        if type(max_tracked) is not int or max_tracked <= 0:
            raise ValueError(f"max_tracked: must be a positive int, got {max_tracked!r}")
        self.agent = agent
        self._tracer = HandoffTracer(
            agent,
            tracer_provider=tracer_provider,
            strict=strict,
            input_filter=input_filter,
            clock=clock,
        )
        # records a refused message as the flagged reject it is, whatever `strict` says
        self._refusals = HandoffTracer(
            agent, tracer_provider=tracer_provider, strict=False, input_filter=input_filter,
            clock=clock,
        )  # fmt: skip
        self._mode = mode
        self._max = max_tracked
        self._handoffs: dict[str, Handoff] = {}  # by A2A task id
        self._refused: dict[str, None] = {}  # A2A task ids whose envelope was refused
        self._lock = threading.Lock()
        self._store: TaskStore | None = None
        self.errors = 0
        self.refused = 0
        self.evicted = 0

    def task_store(self, inner: TaskStore) -> TaskStore:
        """`inner` wrapped: every save is observed after it succeeded."""
        if not isinstance(inner, TaskStore):
            raise TypeError(f"inner: expected an a2a TaskStore, got {type(inner).__name__}")
        self._store = inner
        return _ObservedTaskStore(inner, self)

    def request_handler(self, inner: RequestHandler) -> RequestHandler:
        """`inner` wrapped: a message to a task in a terminal state is recorded first."""
        if not isinstance(inner, RequestHandler):
            raise TypeError(f"inner: expected an a2a RequestHandler, got {type(inner).__name__}")
        return _ObservedRequestHandler(inner, self)

    # -- internals --------------------------------------------------------------------------

    def _headers(self, context: Any) -> dict[str, str]:
        state = getattr(context, "state", None) or {}
        headers = state.get("headers") or {}
        return {str(k).lower(): str(v) for k, v in headers.items()}

    def _begin(self, task: Any, context: Any) -> Handoff:
        """The Handoff of a task seen for the first time (created here when no wire)."""
        wire = _wire_of(task)
        if wire is not None:
            return self._tracer.receive(wire)
        env = Envelope(
            task_id=task.context_id or task.id,
            handoff_id=task.id,
            from_agent=UNKNOWN_CLIENT,
            to_agent=self.agent,
            mode=self._mode,
            topology="federated_a2a",
            payload_hash=parts_payload_hash(task.history[0]) if task.history else None,
            message_id=(task.history[0].message_id or None) if task.history else None,
        )
        token = otel_context.attach(_PROPAGATOR.extract(self._headers(context)))
        try:
            return self._tracer.create(env)
        finally:
            otel_context.detach(token)

    def _remember(self, task_id: str, h: Handoff) -> None:
        self._handoffs[task_id] = h
        while len(self._handoffs) > self._max:
            self._handoffs.pop(next(iter(self._handoffs)))
            self.evicted += 1

    def _emit(self, h: Handoff, event: str, at: int | None, **attrs: Any) -> None:
        # an A2A state contradicting the handoff is no message the agent refused: a strict
        # observer does not hand it to its tracer (which would record a refusal) but drops it
        legal = (State(h.state), event) in TRANSITIONS
        try:
            if not legal and self._tracer.strict:
                raise IllegalTransition(h.state, event)
            h.transition(event, at, **attrs)
        except IllegalTransition:  # strict: not emitted; a drop is a metric
            self.refused += 1
            _log.warning("a2a: refused illegal %s from %s on %s", event, h.state, h.handoff_id)

    def _observe(self, task: Any, context: Any) -> None:
        a2a_state = _a2a_state(task)
        at = None  # the tracer's clock: see the module doc
        with self._lock:
            if task.id in self._refused:
                return
            h = self._handoffs.get(task.id)
            if h is None:
                try:
                    h = self._begin(task, context)
                except EnvelopeError as exc:
                    self._refuse_task(task.id, exc)
                    return
                self._remember(task.id, h)
            for ev in a2a_events(a2a_state, h.state):
                attrs: dict[str, Any] = {}
                if ev in _ERROR_EVENTS:
                    attrs["error_code"] = a2a_state_error_code(a2a_state, _stated_code(task))
                if ev == "commit":
                    refs = [f"a2a-artifact:{a.artifact_id}" for a in task.artifacts]
                    attrs.update(
                        evidence_count=len(refs),
                        evidence_valid=len(refs) >= 1,
                        evidence_refs=refs[:_MAX_REFS],
                        receipt_status=a2a_state,
                        result_fields=_data_fields(task.artifacts),
                    )
                before = h.state
                self._emit(h, str(ev), at, **attrs)
                if h.state == before:  # illegal (flagged or refused): the walk stops
                    break

    def _refuse_task(self, task_id: str, exc: EnvelopeError) -> None:
        """The task's envelope was refused (receive() recorded the reject): its later saves
        record nothing more, so one refusal is one reject. Counted in `refused`."""
        self.refused += 1
        self._refused[task_id] = None
        while len(self._refused) > self._max:
            self._refused.pop(next(iter(self._refused)))
        _log.warning("a2a: refused the envelope of task %s: %s", task_id, exc)

    async def _lookup(self, task_id: str, context: Any) -> Handoff | None:
        with self._lock:
            if task_id in self._refused:
                return None
            h = self._handoffs.get(task_id)
        if h is not None or self._store is None:
            return h
        task = await self._store.get(task_id, context)
        if task is None:
            return None
        wire = (
            _wire_of(task)
            or Envelope(
                task_id=task.context_id or task.id,
                handoff_id=task.id,
                from_agent=UNKNOWN_CLIENT,
                to_agent=self.agent,
                mode=self._mode,
                topology="federated_a2a",
            ).to_wire()
        )
        try:
            h = self._tracer.receive({**wire, "state": _state_after(_a2a_state(task))})
        except EnvelopeError as exc:
            with self._lock:
                self._refuse_task(task_id, exc)
            return None
        with self._lock:
            self._remember(task_id, h)
        return h

    async def _on_message(self, params: Any, context: Any) -> None:
        task_id = params.message.task_id
        if not task_id:
            return
        h = await self._lookup(task_id, context)
        if h is not None and h.state in TERMINAL:
            with self._lock:
                self._refuse_message(h)

    def _refuse_message(self, h: Handoff) -> None:
        """The agent refuses a message to a handoff that already ended: its `reject`, from
        the terminal state, so flagged valid=false (no reject is legal there, and the
        handoff's outcome stands: one message was refused, not the handoff), error_code
        REFUSAL_CODE, as a strict receiver's shim records a refused message."""
        late = self._refusals.receive(h.to_wire())
        late.transition("reject", None, error_code=REFUSAL_CODE)

    def _on_refused(self, params: Any, exc: BaseException) -> None:
        """The SDK refused a message: a handoff it would have started (or one still
        `created`) is rejected with the error's code (collector.a2a.a2a_error_code)."""
        msg = params.message
        with self._lock:
            if msg.task_id:
                h = self._handoffs.get(msg.task_id)
            else:
                wire = _message_wire(msg)
                if wire is None:
                    return  # a client without the interceptor: no handoff to name
                h = next(
                    (k for k in self._handoffs.values() if k.handoff_id == wire.get("handoff_id")),
                    None,
                )
                if h is None:
                    try:
                        h = self._tracer.receive(wire)
                    except EnvelopeError:
                        return  # receive() already recorded its own reject of the envelope
            if h is None or h.state != State.CREATED:
                return
            self._emit(h, "reject", None, error_code=a2a_error_code(exc))

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self.errors += 1
            _log.exception("a2a observer failed to record")

    async def _guarded_async(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            await fn(*args)
        except Exception:
            self.errors += 1
            _log.exception("a2a observer failed to record")


class _ObservedTaskStore(TaskStore):
    """A TaskStore that reports every successful save to its observer."""

    def __init__(self, inner: TaskStore, observer: A2AServerObserver) -> None:
        self._inner = inner
        self._observer = observer

    async def save(self, task: Any, context: Any = None) -> None:
        await self._inner.save(task, context)
        self._observer._guarded(self._observer._observe, task, context)

    async def get(self, task_id: str, context: Any = None) -> Any:
        return await self._inner.get(task_id, context)

    async def list(self, params: Any, context: Any = None) -> Any:
        return await self._inner.list(params, context)

    async def delete(self, task_id: str, context: Any = None) -> None:
        await self._inner.delete(task_id, context)


class _ObservedRequestHandler(RequestHandler):
    """Delegates every request; messages are shown to the observer first."""

    def __init__(self, inner: RequestHandler, observer: A2AServerObserver) -> None:
        self._inner = inner
        self._observer = observer

    async def on_message_send(self, params: Any, context: Any) -> Any:
        await self._observer._guarded_async(self._observer._on_message, params, context)
        try:
            return await self._inner.on_message_send(params, context)
        except A2AError as exc:
            self._observer._guarded(self._observer._on_refused, params, exc)
            raise

    async def on_message_send_stream(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        await self._observer._guarded_async(self._observer._on_message, params, context)
        try:
            async for event in self._inner.on_message_send_stream(params, context):
                yield event
        except A2AError as exc:
            self._observer._guarded(self._observer._on_refused, params, exc)
            raise

    async def on_get_task(self, params: Any, context: Any) -> Any:
        return await self._inner.on_get_task(params, context)

    async def on_list_tasks(self, params: Any, context: Any) -> Any:
        return await self._inner.on_list_tasks(params, context)

    async def on_cancel_task(self, params: Any, context: Any) -> Any:
        return await self._inner.on_cancel_task(params, context)

    async def on_create_task_push_notification_config(self, params: Any, context: Any) -> Any:
        return await self._inner.on_create_task_push_notification_config(params, context)

    async def on_get_task_push_notification_config(self, params: Any, context: Any) -> Any:
        return await self._inner.on_get_task_push_notification_config(params, context)

    async def on_subscribe_to_task(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        async for event in self._inner.on_subscribe_to_task(params, context):
            yield event

    async def on_list_task_push_notification_configs(self, params: Any, context: Any) -> Any:
        return await self._inner.on_list_task_push_notification_configs(params, context)

    async def on_delete_task_push_notification_config(self, params: Any, context: Any) -> Any:
        return await self._inner.on_delete_task_push_notification_config(params, context)

    async def on_get_extended_agent_card(self, params: Any, context: Any) -> Any:
        return await self._inner.on_get_extended_agent_card(params, context)
