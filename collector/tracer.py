"""The tracer shim: one OTel span per handoff transition, emitted as it happens.

`HandoffTracer.create(envelope)` starts a handoff (emits `create`); `Handoff.to_wire()`
carries it to the receiver with W3C `traceparent`; `HandoffTracer.receive(wire)` rebuilds
it on the other side in the SENDER's trace. Every event of the state table is a method.

Parenting: a transition's span is a child of the caller's current span when that span is
in the handoff's trace; otherwise a child of the handoff's anchor (the `create` span, local
or remote), with a link to the caller's current span if it lives in another trace. So the
receiver's spans join the sender's trace even inside the receiver's own request span.

The hot path is lean on purpose (see bench/shim_overhead.py): the envelope attributes are
computed and filtered once at `create`; a transition is a table lookup, one small dict and
one span. No regex, no deep copy per transition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, get_current_span

from collector import semconv as sc
from collector._attrs import transition_attributes
from collector._events import EventMethods
from collector._redact import InputFilter
from collector._refused import refused_message_attributes
from collector._topology import (
    as_versions,
    compatibility,
    create_attributes,
    is_replaying,
    wire_compatibility,
)
from collector._wire import (
    EVENT_TARGET,
    INSTRUMENTATION_NAME,
    SPAN_NAME,
    STATES,
    TABLE,
    default_filter,
    envelope_attributes,
    format_traceparent,
    parse_traceparent,
    refusal_attributes,
    retry_envelope,
    synthetic_anchor,
    to_ns,
)
from collector.contract import RETRY_NEEDS_RESOLUTION, IllegalTransition, RetryRefused, State
from collector.envelope import Envelope, EnvelopeError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider
    from typing_extensions import Unpack

    from collector._attrs import TransitionAttrs
    from collector._topology import AgentCardRef, Enqueued, HistoryReport

__all__ = [
    "INSTRUMENTATION_NAME",
    "SPAN_NAME",
    "Handoff",
    "HandoffTracer",
    "format_traceparent",
    "parse_traceparent",
]


class HandoffTracer:
    """Creates and receives handoffs for one agent (`actor`), emitting through an OTel tracer.

    `tracer_provider`: any TracerProvider; None means `opentelemetry.trace.get_tracer_provider()`
    (read, never set). `strict`: raise IllegalTransition on an illegal event (state unchanged,
    no span of it; the receiver's tracer records the refused message as a flagged `reject`,
    see `Handoff.transition`); lenient (False) emits it flagged `handoff.valid=false`, state
    unchanged.
    `input_filter`: redacts envelope text at create (None: the default InputFilter).
    `clock`: returns int ns since the epoch (default time.time_ns); used when `at` is None.
    `supported_versions`: the envelope schema versions this agent consumes; when given,
    its `accept` and `reject` spans carry them and the envelope's unknown fields.
    """

    __slots__ = ("_clock", "_filter", "_tracer", "actor", "strict", "supported_versions")

    def __init__(
        self,
        actor: str,
        *,
        tracer_provider: TracerProvider | None = None,
        strict: bool = True,
        input_filter: InputFilter | None = None,
        clock: Callable[[], int] | None = None,
        supported_versions: Iterable[int] | None = None,
    ) -> None:
        if not isinstance(actor, str) or not actor:
            raise ValueError(f"actor: must be a non-empty string, got {actor!r}")
        if input_filter is not None and not isinstance(input_filter, InputFilter):
            raise TypeError(
                f"input_filter: expected an InputFilter, got {type(input_filter).__name__}"
            )
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.actor = actor
        self.strict = bool(strict)
        self._tracer: Tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        self._filter = input_filter if input_filter is not None else default_filter()
        self._clock = clock if clock is not None else time.time_ns
        self.supported_versions = (
            None
            if supported_versions is None
            else as_versions("supported_versions", supported_versions)
        )

    def create(
        self,
        envelope: Envelope,
        at: datetime | int | None = None,
        *,
        history: HistoryReport | None = None,
        agent_card: AgentCardRef | None = None,
        enqueued: Enqueued | None = None,
    ) -> Handoff:
        """Start a handoff: emit its `create` span now (a child of the caller's current span,
        or a new trace's root) and return the Handoff in state `created`. The span carries
        `handoff.attempt` (the envelope's, 1 when it has none), a transfer's `history`
        (`filter_history(...).report`), the `agent_card` the sender relied on and, from a
        shared-queue producer, where it `enqueued` the message (queue name and offset)."""
        if not isinstance(envelope, Envelope):
            raise TypeError(f"envelope: expected an Envelope, got {type(envelope).__name__}")
        flag = create_attributes(history, agent_card, enqueued)
        return self._create(envelope, at, flag)

    def retry(
        self,
        previous: Handoff,
        handoff_id: str,
        at: datetime | int | None = None,
        *,
        idempotency_key: str | None = None,
        **changes: Any,
    ) -> Handoff:
        """Start the next attempt of `previous`'s task at the same target: a `create` with
        `handoff.retry_of` = previous.handoff_id and `handoff.attempt` = previous's + 1.

        The envelope is previous's with `handoff_id`, the same idempotency key unless
        `idempotency_key` is given, and `changes` (other envelope fields; task_id, to_agent,
        attempt and retry_of are the retry's own and refused there: ValueError).
        When previous is still `unknown` (after a timeout the receiver may have acted), a
        strict tracer raises RetryRefused (nothing emitted): query the status by handoff id
        or idempotency key and record resolve_committed / resolve_failed first. A lenient
        one emits the create with `handoff.retry_unresolved=true`; the create stays valid
        (it is a legal create of a new handoff), so funnels count the attempt as usual.
        """
        if not isinstance(previous, Handoff):
            raise TypeError(f"previous: expected a Handoff, got {type(previous).__name__}")
        env = retry_envelope(previous.envelope, handoff_id, idempotency_key, changes)
        flag = None
        state = previous.state
        if state in RETRY_NEEDS_RESOLUTION:
            if self.strict:
                raise RetryRefused(previous.handoff_id, state)
            flag = {sc.RETRY_UNRESOLVED: True}
        return self._create(env, at, flag)

    def _create(
        self, envelope: Envelope, at: datetime | int | None, flag: dict[str, Any] | None
    ) -> Handoff:
        start_ns = to_ns(at, self._clock)
        attrs = envelope_attributes(envelope, self._filter)
        if flag:
            attrs.update(flag)
        if is_replaying():
            attrs[sc.REPLAY] = True
        attrs.update(
            {
                sc.TASK_ID: envelope.task_id,
                sc.HANDOFF_ID: envelope.handoff_id,
                sc.EVENT: "create",
                sc.FROM_STATE: "",
                sc.TO_STATE: "created",
                sc.ACTOR: self.actor,
                sc.GEN_AI_AGENT_NAME: self.actor,
                sc.GEN_AI_OPERATION_NAME: "handoff.create",
            }
        )
        span = self._tracer.start_span("handoff.create", attributes=attrs, start_time=start_ns)
        span.end(end_time=start_ns)
        h = Handoff(self, envelope, span.get_span_context(), str(State.CREATED))
        h._last = ("handoff.create", attrs)
        return h

    def receive(self, wire: Mapping[str, Any], at: datetime | int | None = None) -> Handoff:
        """The handoff a sender's `Handoff.to_wire()` describes, on this (receiving) side.

        Emits no span for an envelope it takes. Later transitions join the sender's trace
        (from `traceparent`); without a traceparent they share one fresh trace. The state is
        taken from the wire (`created` when absent). Raises EnvelopeError on a bad envelope,
        a malformed traceparent or an unknown state. An envelope it refuses (incompatible
        major version, missing required field, invalid field or traceparent) is first
        recorded as this receiver's `reject`, `handoff.error_code` = the EnvelopeError's
        code (`incompatible_protocol`, `missing_required_field`, `invalid_envelope`), when
        task_id and handoff_id can be read from the wire and the wire's state is one a
        reject leaves (`created`; a lenient tracer records it from any known state,
        flagged). `at`: the time of that reject (None: the tracer's clock).
        """
        state = (wire.get("state") or "created") if isinstance(wire, Mapping) else "created"
        if not isinstance(state, str) or state not in STATES:
            raise EnvelopeError("state", f"unknown state {state!r}")
        try:
            envelope = Envelope.from_wire(wire)
            tp = wire.get("traceparent")
            # No traceparent (a sender without telemetry, or not our shim): one fresh trace.
            anchor = (
                synthetic_anchor() if tp is None else parse_traceparent(tp, wire.get("tracestate"))
            )
        except EnvelopeError as exc:
            self._refuse(wire, state, exc, at)
            raise
        return Handoff(self, envelope, anchor, str(state))

    def _refuse(self, wire: Any, state: str, exc: EnvelopeError, at: datetime | int | None) -> None:
        """Emit the receiver's `reject` of a refused envelope (see `receive`), if it can."""
        a = refusal_attributes(wire, state, exc.code, self.actor, strict=self.strict)
        if a is None:
            return
        if self.supported_versions is not None:
            a.update(wire_compatibility(wire, self.supported_versions))
        if is_replaying():
            a[sc.REPLAY] = True
        try:
            anchor = parse_traceparent(wire.get("traceparent"), None)
        except EnvelopeError:
            anchor = synthetic_anchor()
        start_ns = to_ns(at, self._clock)
        ctx = trace.set_span_in_context(NonRecordingSpan(anchor))
        cur = get_current_span().get_span_context()  # the receiver's request, as for transitions
        links = (Link(cur),) if cur.is_valid and cur.trace_id != anchor.trace_id else None
        span = self._tracer.start_span(
            SPAN_NAME["reject"], context=ctx, attributes=a, start_time=start_ns, links=links
        )
        span.end(end_time=start_ns)


_CONSUMER_EVENTS: Final = frozenset({"accept", "reject"})
_RESULT_EVENTS: Final = frozenset({"prepare", "commit", "resolve_committed"})


class Handoff(EventMethods):
    """One handoff as seen by one agent. Each event method emits one span immediately.

    Methods take `at` (aware datetime or int ns since the epoch; None = the tracer's clock)
    and the optional transition attributes of `transition`. They return the state after.
    Thread-safe: transitions of one Handoff are serialized.
    """

    __slots__ = (
        "_anchor",
        "_base",
        "_consumer",
        "_last",
        "_lock",
        "_otel",
        "_parent_ctx",
        "_state",
        "_strict",
        "_t",
        "_trace_id",
        "_wire",
        "envelope",
    )

    def __init__(
        self, tracer: HandoffTracer, envelope: Envelope, anchor: SpanContext, state: str
    ) -> None:
        self._t = tracer
        self.envelope = envelope
        self._state = state
        self._anchor = anchor
        self._trace_id = anchor.trace_id
        self._otel = tracer._tracer
        self._strict = tracer.strict
        self._parent_ctx = trace.set_span_in_context(NonRecordingSpan(anchor))
        self._base: dict[str, Any] = {
            sc.TASK_ID: envelope.task_id,
            sc.HANDOFF_ID: envelope.handoff_id,
            sc.ACTOR: tracer.actor,
            sc.GEN_AI_AGENT_NAME: tracer.actor,
        }
        self._lock = threading.Lock()
        #: the consumer's supported versions and the envelope's unknown fields, for accept/reject
        self._consumer: dict[str, Any] | None = (
            None
            if tracer.supported_versions is None
            else compatibility(envelope, tracer.supported_versions).attributes()
        )
        self._last: tuple[str, dict[str, Any]] | None = None
        self._wire: dict[str, Any] | None = None
        #: tool calls counted with count_tool_call (None: never counted)
        self._tool_calls: int | None = None

    # -- identity ---------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The current state (read-only: it changes only through transitions)."""
        return self._state

    @property
    def handoff_id(self) -> str:
        return self.envelope.handoff_id

    @property
    def task_id(self) -> str:
        return self.envelope.task_id

    @property
    def trace_id(self) -> str:
        """The handoff's trace id (the sender's), 32 lower-case hex digits."""
        return f"{self._anchor.trace_id:032x}"

    @property
    def traceparent(self) -> str:
        """W3C traceparent pointing at the handoff's anchor (the sender's `create` span)."""
        return format_traceparent(self._anchor)

    @property
    def actor(self) -> str:
        return self._t.actor

    def to_wire(self) -> dict[str, Any]:
        """JSON-able dict for the receiver: the envelope fields, `traceparent` (plus
        `tracestate` when the trace carries one) and `state`."""
        if self._wire is None:
            self._wire = self.envelope.to_wire()
            if self._anchor.is_valid:  # invalid when no SDK is configured (no-op tracer)
                self._wire["traceparent"] = self.traceparent
                if self._anchor.trace_state:
                    self._wire["tracestate"] = self._anchor.trace_state.to_header()
        d = dict(self._wire)
        d["state"] = self._state
        return d

    def __repr__(self) -> str:
        return (
            f"Handoff(handoff_id={self.handoff_id!r}, state={self.state!r}, actor={self.actor!r})"
        )

    # -- transitions ------------------------------------------------------------------------

    def transition(
        self, event: str, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]
    ) -> str:
        """Apply `event` and emit its span (start time `at`). Returns the state after.

        Raises IllegalTransition for an unknown event or `create` (both modes), and in strict
        mode for an event the table does not allow from the current state (state unchanged;
        no span of that event, but a receiver's tracer, actor = the envelope's to_agent,
        first emits its `reject` of the message, flagged valid=false with error_code
        `conflict`: collector/_refused.py). The keywords (`collector._attrs.TransitionAttrs`
        says what each means and on which events it belongs; not checked against the
        event): ValueError naming one with a wrong type, TypeError for an unknown one. On
        accept / reject of a tracer with `supported_versions`, its window is added; on a
        result after `count_tool_call()`, the count; inside `replaying()`,
        `handoff.replay=true`.
        """
        start_ns = self._t._clock() if at is None else to_ns(at, self._t._clock)
        a = self._base.copy()
        if attrs:
            transition_attributes(a, attrs, start_ns)
        event = str(event)
        name = SPAN_NAME.get(event)
        if name is None or event == "create":
            reason = "create is not an event of an existing handoff" if event == "create" else None
            raise IllegalTransition(self._state, event, reason or f"unknown event {event!r}")
        if self._consumer is not None and event in _CONSUMER_EVENTS:
            for k, v in self._consumer.items():
                a.setdefault(k, v)
        if self._tool_calls is not None and event in _RESULT_EVENTS:
            a.setdefault(sc.TOOL_CALLS, self._tool_calls)
        if is_replaying():
            a[sc.REPLAY] = True
        a[sc.EVENT] = event
        a[sc.GEN_AI_OPERATION_NAME] = name
        with self._lock:
            src = self._state
            dst = TABLE.get((src, event))
            a[sc.FROM_STATE] = src
            if dst is None:
                exc = IllegalTransition(src, event)
                if self._strict:
                    if self._t.actor == self.envelope.to_agent:  # the receiver's refusal
                        r = refused_message_attributes(self._base, src, event, exc, self._consumer)
                        self._emit(SPAN_NAME["reject"], r, start_ns)
                    raise exc
                a[sc.TO_STATE] = EVENT_TARGET[event]
                a[sc.VALID] = False
                a[sc.INVALID_REASON] = str(exc)
            else:
                a[sc.TO_STATE] = dst
            # _emit, inlined: this is the hot path.
            cur = get_current_span().get_span_context()
            if cur.is_valid and cur.trace_id == self._trace_id:
                span = self._otel.start_span(name, attributes=a, start_time=start_ns)
            else:
                span = self._otel.start_span(
                    name,
                    context=self._parent_ctx,
                    attributes=a,
                    start_time=start_ns,
                    links=(Link(cur),) if cur.is_valid else None,
                )
            span.end(end_time=start_ns)
            self._last = (name, a)
            if dst is not None:
                self._state = dst
            return self._state

    def redeliver(self, at: datetime | int | None = None) -> None:
        """Re-emit the last transition as a NEW span with the same attributes (an
        at-least-once duplicate delivery). The state does not change. Raises
        IllegalTransition when this Handoff object has emitted nothing yet."""
        start_ns = to_ns(at, self._t._clock)
        with self._lock:
            if self._last is None:
                raise IllegalTransition(
                    self._state, "redeliver", "nothing to redeliver: no transition emitted yet"
                )
            name, a = self._last
            if is_replaying() and a.get(sc.REPLAY) is not True:
                a = {**a, sc.REPLAY: True}
            self._emit(name, a, start_ns)

    def _emit(self, name: str, attrs: dict[str, Any], start_ns: int) -> None:
        cur = get_current_span().get_span_context()
        if cur.is_valid and cur.trace_id == self._trace_id:
            span = self._otel.start_span(name, attributes=attrs, start_time=start_ns)
        else:
            links = (Link(cur),) if cur.is_valid else None
            span = self._otel.start_span(
                name, context=self._parent_ctx, attributes=attrs, start_time=start_ns, links=links
            )
        span.end(end_time=start_ns)

    def retry(
        self,
        handoff_id: str,
        at: datetime | int | None = None,
        *,
        idempotency_key: str | None = None,
        **changes: Any,
    ) -> Handoff:
        """The next attempt of this handoff's task at the same target, created by this
        Handoff's tracer (so call it on the sender's Handoff: the sender creates): see
        `HandoffTracer.retry` (strict refuses while `unknown`)."""
        return self._t.retry(self, handoff_id, at, idempotency_key=idempotency_key, **changes)
