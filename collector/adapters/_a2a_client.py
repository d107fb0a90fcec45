"""The A2A client half of collector.adapters.a2a (see its module doc): the interceptor."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from a2a.client.client import ClientCallContext
from a2a.client.interceptors import AfterArgs, BeforeArgs, ClientCallInterceptor
from google.protobuf.json_format import MessageToDict

from collector._payload import payload_hash
from collector._policy import must_return_fields
from collector._topology import AgentCardRef
from collector.a2a import a2a_error_code
from collector.envelope import MODES, Envelope, EvidencePolicy
from collector.tracer import HandoffTracer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from collector._redact import InputFilter
    from collector.tracer import Handoff

__all__ = ["METADATA_KEY", "HandoffClientInterceptor", "parts_payload_hash"]

#: Message metadata key carrying the envelope wire (JSON string, with traceparent).
METADATA_KEY: Final = "aa-handoff"


def parts_payload_hash(message: Any) -> str:
    """`handoff.payload_hash` of an A2A message: `{"a2a_parts": [...]}`, its parts in order,
    each in the protobuf JSON mapping (`MessageToDict`). The metadata (which carries the
    envelope) and the message and task ids are not part of it."""
    return payload_hash({"a2a_parts": [MessageToDict(p) for p in message.parts]})


class HandoffClientInterceptor(ClientCallInterceptor):
    """A2A client interceptor: `create` + envelope/traceparent on messages that start a task.

    `actor`: the calling agent's name (from_agent). `tracer_provider`: required. `mode`
    (default `delegate`), `deadline_ms` (> 0 or None), `capabilities` (granted, recorded on
    the envelope): envelope fields of every handoff. `strict`, `input_filter`, `clock`: for
    the HandoffTracer. The task id is the message's context_id, else its message_id; pass
    `ClientCallContext(state={"aa-handoff.task_id": "..."})` to name it. Follow-up messages
    (with a task id) carry the known handoff's traceparent and create nothing.
    `handoffs`: A2A task id -> Handoff, for tasks this client started (bounded like the server).
    Each `create` records the Agent Card the call goes to (`handoff.agent_card.*`: its first
    interface URL, its skill ids, when it was fetched) when the card has an interface URL.
    `card_fetched_at` (ISO-8601 UTC) is when you fetched it; without it, the first time this
    interceptor saw a card at that URL stands in (a client holds the card it was built with, so
    the first call comes soon after the fetch; a card fetched long before is seen fresher).
    Each `create` carries `handoff.payload_hash` = `parts_payload_hash(message)` and
    `handoff.message.id` = the A2A message's messageId.
    `must_return` (field names) and `evidence_policy` (a collector.EvidencePolicy or its
    dict): what every result must carry, declared on each envelope for the platform to check
    (the server observer records the fields of the artifacts' data parts); EnvelopeError
    naming a bad one.
    """

    def __init__(
        self,
        *,
        actor: str,
        tracer_provider: TracerProvider,
        mode: str = "delegate",
        deadline_ms: int | None = None,
        capabilities: tuple[str, ...] = (),
        strict: bool = True,
        input_filter: InputFilter | None = None,
        clock: Callable[[], int] | None = None,
        max_tracked: int = 10_000,
        card_fetched_at: str | None = None,
        must_return: Iterable[str] = (),
        evidence_policy: EvidencePolicy | Mapping[str, Any] | None = None,
    ) -> None:
        if tracer_provider is None:
            raise ValueError("tracer_provider: required (an OTel TracerProvider)")
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {sorted(MODES)}, got {mode!r}")
        if deadline_ms is not None and (type(deadline_ms) is not int or deadline_ms <= 0):
            raise ValueError(f"deadline_ms: must be a positive int (ms), got {deadline_ms!r}")
        self._tracer = HandoffTracer(
            actor,
            tracer_provider=tracer_provider,
            strict=strict,
            input_filter=input_filter,
            clock=clock,
        )
        self._mode = mode
        self._deadline_ms = deadline_ms
        self._capabilities = tuple(capabilities)
        self._must_return = must_return_fields(must_return)
        self._policy = None if evidence_policy is None else EvidencePolicy.coerce(evidence_policy)
        if card_fetched_at is not None:
            AgentCardRef("-", card_fetched_at)  # ValueError naming fetched_at if not UTC
        self._card_fetched_at = card_fetched_at
        self._cards_seen: dict[str, str] = {}  # card URL -> first seen, ISO-8601 UTC
        self._clock = clock if clock is not None else time.time_ns
        self._max = max_tracked
        self._pending: dict[str, Handoff] = {}  # by message id, until the task id is known
        self.handoffs: dict[str, Handoff] = {}

    async def before(self, args: BeforeArgs) -> None:
        if args.method not in ("send_message", "send_message_streaming"):
            return
        msg = args.input.message
        if args.context is None:
            args.context = ClientCallContext()
        ctx = args.context
        params = dict(ctx.service_parameters or {})
        if msg.task_id:
            known = self.handoffs.get(msg.task_id)
            if known is not None:
                params["traceparent"] = known.traceparent
                ctx.service_parameters = params
            return
        env = Envelope(
            task_id=str(ctx.state.get("aa-handoff.task_id") or msg.context_id or msg.message_id),
            handoff_id=f"a2a-{msg.message_id}",
            from_agent=self._tracer.actor,
            to_agent=args.agent_card.name or "a2a-agent",
            mode=self._mode,
            topology="federated_a2a",
            deadline_ms=self._deadline_ms,
            capabilities=self._capabilities,
            payload_hash=parts_payload_hash(msg),
            message_id=msg.message_id or None,
            must_return=self._must_return,
            evidence_policy=self._policy,
        )
        h = self._tracer.create(env, agent_card=self._card_ref(args.agent_card))
        msg.metadata[METADATA_KEY] = json.dumps(h.to_wire(), separators=(",", ":"))
        params["traceparent"] = h.traceparent
        ctx.service_parameters = params
        self._pending[msg.message_id] = h
        while len(self._pending) > self._max:
            self._pending.pop(next(iter(self._pending)))

    def _card_ref(self, card: Any) -> AgentCardRef | None:
        interfaces = getattr(card, "supported_interfaces", None) or ()
        url = next((i.url for i in interfaces if i.url), "")
        if not url:
            return None
        fetched = self._card_fetched_at
        if fetched is None:
            fetched = self._cards_seen.get(url)
            if fetched is None:
                now = datetime.fromtimestamp(self._clock() // 10**9, UTC).isoformat()
                fetched = self._cards_seen[url] = now.replace("+00:00", "Z")
                while len(self._cards_seen) > self._max:
                    self._cards_seen.pop(next(iter(self._cards_seen)))
        skills = tuple(sk.id for sk in getattr(card, "skills", ()) if sk.id)
        return AgentCardRef(url, fetched, skills)

    def record_refusal(self, message_id: str, error: BaseException) -> str | None:
        """Record that the server refused the message `message_id` started a handoff with
        (the `A2AError` `send_message` raised): this client's `reject`, error_code from
        `collector.a2a.a2a_error_code`. Returns the code, or None when no handoff of this
        client waits on that message (unknown, or already past `created`). For servers
        without `A2AServerObserver`: one that has it records the refusal itself."""
        h = self._pending.get(message_id)
        if h is None or h.state != "created":
            return None
        code = a2a_error_code(error)
        h.reject(error_code=code)
        self._pending.pop(message_id, None)
        return code

    async def after(self, args: AfterArgs) -> None:
        result = args.result
        task = None
        if result is not None and hasattr(result, "HasField") and result.HasField("task"):
            task = result.task
        if task is None or not task.history:
            return
        h = self._pending.pop(task.history[0].message_id, None)
        if h is not None:
            self.handoffs[task.id] = h
            while len(self.handoffs) > self._max:
                self.handoffs.pop(next(iter(self.handoffs)))
