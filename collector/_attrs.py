"""The optional attributes of a transition span, type-checked: one table, one pure function.

Kept apart from collector/tracer.py (which owns the OTel calls and the state): each keyword
of `Handoff.transition` (the keys of `TransitionAttrs`, the one list of them) becomes its
`handoff.*` attribute(s), or a ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypedDict

from collector import semconv as sc
from collector._topology import QueuePosition, ResultItems, as_versions, queue_attributes
from collector._wire import RESERVED, bad_attr, evidence_attributes
from collector.envelope import EvidenceRef, utc_time_problem

__all__ = ["TRANSITION_KEYWORDS", "TransitionAttrs", "transition_attributes"]


class TransitionAttrs(TypedDict, total=False):
    """The keywords of `Handoff.transition` and the event methods (None = absent).

    They belong to events (docs/semantic-conventions.md says which): `error_code` on
    reject / fail / timeout (any string is kept as sent; `semconv.ERROR_CODES` is the
    vocabulary); evidence on results (refs given as EvidenceRef also emit their claims and
    valid_at times, aligned with the ids); `receipt_id` / `receipt_expires_at` (ISO-8601 UTC)
    on commit / resolve_committed; `read_back` / `conflicts` on verify / verify_fail (the
    receipt was read back from the receiver; what differed); `queue` on accept (the queue
    position, and the lag from the message's enqueue time to the transition);
    `result_items` on results (expected vs returned items); `result_fields` on results (the
    field names the result returned, checked against the reply contract's must_return);
    `tool_calls` on results (int >= 0: the tool calls used for the handoff so far, a running
    total; the greatest is compared with the envelope's max_tool_calls);
    `supported_versions` /
    `unknown_fields` on accept / reject (the consumer's window); `extra` adds other keys
    but never overrides the contract's identity keys.
    """

    error_code: str | None
    fence_token: int | None
    state_version: int | None
    payload_hash: str | None
    evidence_count: int | None
    evidence_valid: bool | None
    evidence_refs: Iterable[str | EvidenceRef] | None
    receipt_status: str | None
    receipt_hash: str | None
    result_version: str | None
    execution_id: str | None
    execution_version: str | None
    receipt_id: str | None
    receipt_expires_at: str | None
    read_back: bool | None
    conflicts: Iterable[str] | None
    queue: QueuePosition | None
    result_items: ResultItems | None
    result_fields: Iterable[str] | None
    tool_calls: int | None
    supported_versions: Iterable[int] | None
    unknown_fields: Iterable[str] | None
    extra: Mapping[str, Any] | None


#: (attributes, keyword, value, transition time in ns) -> None: adds or raises ValueError
_Setter = Callable[[dict[str, Any], str, Any, int], None]


def _str(attr: str) -> _Setter:
    def put(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
        if not isinstance(v, str):
            raise bad_attr(kw, "str", v)
        a[attr] = v

    return put


def _int(attr: str, minimum: int | None = None) -> _Setter:
    want = "int" if minimum is None else f"int >= {minimum}"

    def put(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
        if type(v) is not int or (minimum is not None and v < minimum):
            raise bad_attr(kw, want, v)
        a[attr] = v

    return put


def _bool(attr: str) -> _Setter:
    def put(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
        if type(v) is not bool:
            raise bad_attr(kw, "bool", v)
        a[attr] = v

    return put


def _strs(attr: str) -> _Setter:
    def put(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
        if isinstance(v, str) or not isinstance(v, Iterable):
            raise bad_attr(kw, "a list of str", v)
        found = tuple(v)
        for c in found:
            if not isinstance(c, str):
                raise bad_attr(kw, "a list of str", c)
        a[attr] = found

    return put


def _evidence_refs(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
    if isinstance(v, str) or not isinstance(v, Iterable):
        raise bad_attr(kw, "a list of ids", v)
    items = tuple(v)
    if all(type(r) is str for r in items):
        a[sc.EVIDENCE_REFS] = items
        return
    for r in items:
        if not isinstance(r, str | EvidenceRef):
            raise bad_attr(kw, "a list of str ids (or EvidenceRef)", r)
    a.update(evidence_attributes(tuple(EvidenceRef.coerce(r) for r in items)))


def _utc(attr: str) -> _Setter:
    def put(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
        problem = utc_time_problem(v)
        if problem is not None:
            raise ValueError(f"{kw}: {problem}")
        a[attr] = v

    return put


def _queue(a: dict[str, Any], kw: str, v: Any, ns: int) -> None:
    if not isinstance(v, QueuePosition):
        raise bad_attr(kw, "a QueuePosition", v)
    a.update(queue_attributes(v, ns))


def _result_items(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
    if not isinstance(v, ResultItems):
        raise bad_attr(kw, "a ResultItems", v)
    a.update(v.attributes())


def _versions(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
    a[sc.CONSUMER_SUPPORTED_VERSIONS] = as_versions(kw, v)


def _extra(a: dict[str, Any], kw: str, v: Any, _ns: int) -> None:
    if not isinstance(v, Mapping):
        raise bad_attr(kw, "a mapping", v)
    for k in v:
        if not isinstance(k, str) or k in RESERVED:
            raise ValueError(f"extra: key {k!r} is not allowed (reserved or not a string)")
    a.update(v)


_SETTERS: Final[dict[str, _Setter]] = {
    "error_code": _str(sc.ERROR_CODE),
    "fence_token": _int(sc.FENCE_TOKEN),
    "state_version": _int(sc.STATE_VERSION),
    "payload_hash": _str(sc.PAYLOAD_HASH),
    "evidence_count": _int(sc.EVIDENCE_COUNT, 0),
    "evidence_valid": _bool(sc.EVIDENCE_VALID),
    "evidence_refs": _evidence_refs,
    "receipt_status": _str(sc.RECEIPT_STATUS),
    "receipt_hash": _str(sc.RECEIPT_HASH),
    "result_version": _str(sc.RESULT_VERSION),
    "execution_id": _str(sc.EXECUTION_ID),
    "execution_version": _str(sc.EXECUTION_VERSION),
    "receipt_id": _str(sc.RECEIPT_ID),
    "receipt_expires_at": _utc(sc.RECEIPT_EXPIRES_AT),
    "read_back": _bool(sc.RECEIPT_READ_BACK),
    "conflicts": _strs(sc.RECEIPT_CONFLICTS),
    "queue": _queue,
    "result_items": _result_items,
    "result_fields": _strs(sc.RESULT_FIELDS),
    "tool_calls": _int(sc.TOOL_CALLS, 0),
    "supported_versions": _versions,
    "unknown_fields": _strs(sc.ENVELOPE_UNKNOWN_FIELDS),
    "extra": _extra,
}
#: every keyword `Handoff.transition` takes besides event and at
TRANSITION_KEYWORDS: Final = frozenset(TransitionAttrs.__annotations__)
assert frozenset(_SETTERS) == TRANSITION_KEYWORDS, "TransitionAttrs and _SETTERS differ"


def transition_attributes(a: dict[str, Any], attrs: Mapping[str, Any], at_ns: int) -> None:
    """Add the given (not None) keywords' attributes to `a`, in place. TypeError on an
    unknown keyword; ValueError naming the keyword on a wrong type (ints are int, bools
    bool, receipt_expires_at an ISO-8601 UTC time, queue a QueuePosition, result_items a
    ResultItems). `at_ns` is the transition's time (the queue lag ends there). `extra` may
    not override the contract's identity keys (RESERVED)."""
    extra = None
    for kw, v in attrs.items():
        put = _SETTERS.get(kw)
        if put is None:
            raise TypeError(f"transition() got an unexpected keyword argument {kw!r}")
        if v is None:
            continue
        if put is _extra:  # last: it may add keys, never override the identity ones
            extra = v
            continue
        put(a, kw, v, at_ns)
    if extra is not None:
        _extra(a, "extra", extra, at_ns)
