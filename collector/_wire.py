"""Span-attribute and wire helpers of the tracer shim: pure functions and tables.

Kept apart from collector/tracer.py (which owns the OTel calls): the state table keyed by
plain strings for the hot path, W3C traceparent formatting/parsing, `at` -> ns, and the
`create` span's envelope attributes (filtered once per handoff).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from collector import semconv as sc
from collector._message import message_attributes
from collector._payload import envelope_payload_hash
from collector._policy import contract_attributes
from collector._redact import InputFilter
from collector.contract import TRANSITIONS, Event, IllegalTransition, State
from collector.envelope import MAX_TEXT_CHARS, Envelope, EnvelopeError, EvidenceRef, Grant

__all__ = [
    "EVENT_TARGET",
    "INSTRUMENTATION_NAME",
    "RESERVED",
    "SPAN_NAME",
    "STATES",
    "TABLE",
    "bad_attr",
    "default_filter",
    "envelope_attributes",
    "evidence_attributes",
    "format_traceparent",
    "grant_attributes",
    "parse_traceparent",
    "refusal_attributes",
    "retry_envelope",
    "synthetic_anchor",
    "to_ns",
]

INSTRUMENTATION_NAME: Final = "handoff-observatory.collector"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)

#: The state each event leads to in the table (every event has exactly one target); used
#: as `to_state` of a flagged illegal transition a lenient tracer emits.
EVENT_TARGET: Final[dict[str, str]] = {str(e): str(s) for (_f, e), s in TRANSITIONS.items()}
EVENT_TARGET[str(Event.CREATE)] = str(State.CREATED)
# Plain-str keyed copy of the table: the hot path looks up (str, str) without enum work.
TABLE: Final[dict[tuple[str, str], str]] = {
    (str(f), str(e)): str(s) for (f, e), s in TRANSITIONS.items()
}
SPAN_NAME: Final[dict[str, str]] = {str(e): f"handoff.{e}" for e in Event}
STATES: Final = frozenset(str(s) for s in State)
#: Attributes the shim owns; `extra` may not override them.
RESERVED: Final = frozenset(
    {
        sc.TASK_ID,
        sc.HANDOFF_ID,
        sc.EVENT,
        sc.FROM_STATE,
        sc.TO_STATE,
        sc.ACTOR,
        sc.VALID,
        sc.INVALID_REASON,
    }
    | {sc.GEN_AI_AGENT_NAME, sc.GEN_AI_OPERATION_NAME}
)

_TRACEPARENT_RE: Final = re.compile(
    r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$"
)

# Same canonical form as foundation.integrity.canonical_json (the shim must not import ingest);
# one encoder object, not one per call.
_CANONICAL: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)

_DEFAULT_FILTER: InputFilter | None = None


def default_filter() -> InputFilter:
    global _DEFAULT_FILTER
    if _DEFAULT_FILTER is None:
        _DEFAULT_FILTER = InputFilter()
    return _DEFAULT_FILTER


def format_traceparent(ctx: SpanContext) -> str:
    """W3C `traceparent` (version 00) of a span context."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: Any, tracestate: Any = None) -> SpanContext:
    """A remote SpanContext from a W3C `traceparent` (and optional `tracestate` header value);
    EnvelopeError('traceparent' / 'tracestate', ...) if bad. An unparsable tracestate entry is
    dropped, as the W3C spec asks."""
    if not isinstance(value, str):
        raise EnvelopeError("traceparent", f"must be a string, got {type(value).__name__}")
    m = _TRACEPARENT_RE.match(value.strip())
    if not m:
        raise EnvelopeError(
            "traceparent", f"not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>): {value!r}"
        )
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        raise EnvelopeError("traceparent", f"invalid version in {value!r}")
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        raise EnvelopeError("traceparent", f"all-zero trace or span id in {value!r}")
    state = None
    if tracestate is not None:
        if not isinstance(tracestate, str):
            raise EnvelopeError("tracestate", f"must be a string, got {type(tracestate).__name__}")
        state = TraceState.from_header([tracestate])
    return SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=state,
    )


def synthetic_anchor() -> SpanContext:
    """A fresh remote parent for a handoff received without a traceparent: the receiver's
    spans then share one new trace (whose root span was never recorded)."""
    return SpanContext(
        random.getrandbits(128) or 1,
        random.getrandbits(64) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def to_ns(at: datetime | int | None, clock: Callable[[], int]) -> int:
    if at is None:
        return clock()
    if type(at) is int:
        if at < 0:
            raise ValueError(f"at: must be >= 0 ns since the epoch, got {at}")
        return at
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(
                "at: naive datetime; pass an aware datetime (e.g. tzinfo=timezone.utc)"
            )
        return ((at - _EPOCH) // _US) * 1000
    raise TypeError(
        f"at: expected an aware datetime, int ns since the epoch or None, got {type(at).__name__}"
    )


def envelope_attributes(env: Envelope, filt: InputFilter) -> dict[str, Any]:
    """The `create` span's envelope attributes, filtered. Computed once per handoff."""
    a: dict[str, Any] = {
        sc.PROTOCOL: env.protocol,
        sc.MODE: env.mode,
        sc.FROM_AGENT: env.from_agent,
        sc.TO_AGENT: env.to_agent,
        sc.TOPOLOGY: env.topology,
    }
    for name, value in (
        (sc.CONTRACT_VERSION, env.contract_version),
        (sc.IDEMPOTENCY_KEY, env.idempotency_key),
        (sc.DEADLINE_MS, env.deadline_ms),
        (sc.MAX_TOOL_CALLS, env.max_tool_calls),
        (sc.CAUSATION_ID, env.causation_id),
        (sc.RETRY_OF, env.retry_of),
        (sc.STATE_VERSION, env.state_version),
        (sc.FENCE_TOKEN, env.fence_token),
        (sc.PAYLOAD_HASH, envelope_payload_hash(env)),  # the caller's hash wins
        (sc.MESSAGE_KIND, env.message_kind),
        (sc.SCHEMA_VERSION, env.schema_version),
    ):
        if value is not None:
            a[name] = value
    a[sc.ATTEMPT] = 1 if env.attempt is None else env.attempt
    if env.capabilities:
        a[sc.CAPABILITIES] = env.capabilities
    if env.evidence_refs:
        a.update(evidence_attributes(env.evidence_refs))
    if env.grant is not None:
        a.update(grant_attributes(env.grant, filt))
    if env.objective is not None:
        a[sc.OBJECTIVE_HASH] = filt.digest(env.objective)
        a[sc.OBJECTIVE_SUMMARY] = filt.summary(env.objective)
    if env.constraints is not None:
        a[sc.CONSTRAINTS] = _CANONICAL.encode(filt.redact(env.constraints))
    if env.parent_state is not None:
        a[sc.PARENT_STATE] = filt.redact_text(env.parent_state)
    if env.reply_contract is not None:
        a[sc.REPLY_CONTRACT] = filt.redact_text(env.reply_contract)
    a.update(contract_attributes(env.evidence_policy, env.must_return))
    a.update(message_attributes(env, filt))
    return a


def evidence_attributes(refs: tuple[EvidenceRef, ...]) -> dict[str, Any]:
    """`handoff.evidence_refs` (the ids) and, when any ref has one, the claims and valid_at
    times as arrays aligned with the ids (`""` where a ref has none)."""
    a: dict[str, Any] = {sc.EVIDENCE_REFS: tuple(r.id for r in refs)}
    if any(r.claim is not None for r in refs):
        a[sc.EVIDENCE_CLAIMS] = tuple(r.claim or "" for r in refs)
    if any(r.valid_at is not None for r in refs):
        a[sc.EVIDENCE_VALID_AT] = tuple(r.valid_at or "" for r in refs)
    return a


_GRANT_ATTRS: Final = (
    ("caller", sc.GRANT_CALLER),
    ("subject", sc.GRANT_SUBJECT),
    ("tenant", sc.GRANT_TENANT),
    ("approval", sc.GRANT_APPROVAL),
    ("expires_at", sc.GRANT_EXPIRES_AT),
    ("capabilities", sc.GRANT_CAPABILITIES),
    ("resources", sc.GRANT_RESOURCES),
)


_GRANT_FILTERED: Final = frozenset({"caller", "subject", "approval"})


def grant_attributes(grant: Grant, filt: InputFilter) -> dict[str, Any]:
    """The grant's `handoff.grant.*` attributes: the fields that are set (lists non-empty).
    caller, subject and approval pass the input filter (a subject given as an email address
    leaves the process redacted: name people by an id)."""
    a: dict[str, Any] = {}
    for field, name in _GRANT_ATTRS:
        v = getattr(grant, field)
        if v is None or v == ():
            continue
        a[name] = filt.redact_text(v) if field in _GRANT_FILTERED else v
    return a


def refusal_attributes(
    wire: Any, state: str, code: str, actor: str, *, strict: bool
) -> dict[str, Any] | None:
    """The attributes of the receiver's `reject` of a refused wire envelope, or None when
    none is recorded: task_id or handoff_id unreadable (not non-empty strings: a refusal
    nobody could attribute), or a `state` a reject does not leave on a strict tracer (a
    lenient one flags it `handoff.valid=false`)."""
    if not isinstance(wire, Mapping):
        return None
    task_id, handoff_id = wire.get("task_id"), wire.get("handoff_id")
    if not isinstance(task_id, str) or not isinstance(handoff_id, str):
        return None
    if not task_id.strip() or not handoff_id.strip():
        return None
    if max(len(task_id), len(handoff_id)) > MAX_TEXT_CHARS:
        return None
    a: dict[str, Any] = {
        sc.TASK_ID: task_id,
        sc.HANDOFF_ID: handoff_id,
        sc.EVENT: "reject",
        sc.FROM_STATE: state,
        sc.TO_STATE: EVENT_TARGET["reject"],
        sc.ACTOR: actor,
        sc.GEN_AI_AGENT_NAME: actor,
        sc.GEN_AI_OPERATION_NAME: SPAN_NAME["reject"],
        sc.ERROR_CODE: code,
    }
    if (state, "reject") not in TABLE:
        if strict:
            return None
        a[sc.VALID] = False
        a[sc.INVALID_REASON] = str(IllegalTransition(state, "reject"))
    return a


_RETRY_OWN: Final = frozenset({"task_id", "to_agent", "attempt", "retry_of"})


def retry_envelope(
    prev: Envelope, handoff_id: str, idempotency_key: str | None, changes: Mapping[str, Any]
) -> Envelope:
    """The envelope of the attempt after `prev`: `handoff_id`, retry_of = prev's id, attempt
    + 1, prev's idempotency key unless one is given, and `changes` (other envelope fields;
    task_id, to_agent, attempt and retry_of are the retry's own: ValueError)."""
    own = _RETRY_OWN.intersection(changes)
    if own:
        raise ValueError(
            f"retry: {', '.join(sorted(own))} cannot change: a retry is the same task at "
            "the same target, numbered from the attempt it retries"
        )
    return dataclasses.replace(
        prev,
        handoff_id=handoff_id,
        retry_of=prev.handoff_id,
        attempt=(prev.attempt or 1) + 1,
        idempotency_key=prev.idempotency_key if idempotency_key is None else idempotency_key,
        **changes,
    )


def bad_attr(name: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {type(value).__name__} {value!r}")
