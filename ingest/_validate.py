"""Validation of one span's handoff attributes against the wire contract. Pure.

Types and required attributes come from collector.semconv.WIRE_ATTRIBUTES; legality from
collector.contract. A span breaking the *shape* (wrong type, required attribute missing)
is rejected; a well-formed but *illegal* transition is kept and flagged
(`handoff.valid=false`, `handoff.invalid_reason`), as is a `handoff.tenant` claim (the span's, else
its resource's) that differs from the credential's tenant (`handoff.tenant_mismatch=true`).

Decoders call `type_problem` per `handoff.*` attribute while they encode values (type tags
are OTLP AnyValue field names: string_value, int_value, bool_value, double_value,
array_value, kvlist_value, bytes_value), then `check_handoff_span` on the encoded strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from collector import contract, semconv

__all__ = [
    "EXPECTED_TAG",
    "ITEM_TAG",
    "TENANT_MISMATCH",
    "CheckResult",
    "check_handoff_span",
    "type_problem",
]

#: Span attribute ingest adds when a span's `handoff.tenant` claim differs from the
#: credential's tenant (the stored tenant is always the credential's).
TENANT_MISMATCH: Final = "handoff.tenant_mismatch"

_WIRE_TYPE: Final = {a.name: a.type for a in semconv.WIRE_ATTRIBUTES}
#: wire attribute -> the OTLP AnyValue field its value must use.
EXPECTED_TAG: Final = {
    name: {
        "string": "string_value",
        "int": "int_value",
        "bool": "bool_value",
        "string[]": "array_value",
        "int[]": "array_value",
    }[t]
    for name, t in _WIRE_TYPE.items()
}
#: array wire attribute -> the OTLP AnyValue field every one of its items must use.
ITEM_TAG: Final = {
    name: {"string[]": "string_value", "int[]": "int_value"}[t]
    for name, t in _WIRE_TYPE.items()
    if t.endswith("[]")
}
#: an item's AnyValue field -> the type of its plain value (bool is not an int here)
_ITEM_TYPE: Final = {"string_value": str, "int_value": int}
_TAG_NAMES: Final = {
    "string_value": "string",
    "int_value": "int",
    "bool_value": "bool",
    "double_value": "double",
    "array_value": "array",
    "kvlist_value": "map",
    "bytes_value": "bytes",
    None: "empty",
}
_IDENTIFYING: Final = tuple(semconv.REQUIRED_ON_EVERY)
_NON_EMPTY: Final = (semconv.HANDOFF_ID, semconv.TASK_ID, semconv.EVENT, semconv.TO_STATE)


@dataclass(frozen=True, slots=True)
class CheckResult:
    is_handoff: bool
    reject_reason: str | None = None
    flags: dict[str, str] | None = None  # attributes to add to the stored span
    #: a `handoff.tenant` claim made on the resource only, to record on the stored span
    claim: str = ""


def type_problem(name: str, tag: str | None, items: list[Any] | None = None) -> str | None:
    """Why attribute `name` with AnyValue field `tag` breaks the wire contract, else None.

    For array attributes pass the array's plain items (all str for string[], all int for
    int[]).
    """
    want = EXPECTED_TAG.get(name)
    if want is None or (tag == want and (want != "array_value" or items is None)):
        return None
    if tag != want:
        return f"attribute {name} must be {_WIRE_TYPE[name]}, got {_TAG_NAMES.get(tag, tag)}"
    if items is None:
        return None
    item = ITEM_TAG[name]
    if not all(type(v) is _ITEM_TYPE[item] for v in items):
        return (
            f"attribute {name} must be {_WIRE_TYPE[name]}, "
            f"got an array with non-{_TAG_NAMES[item]} items"
        )
    return None


@lru_cache(maxsize=4096)
def _illegal_reason(from_state: str, event: str, to_state: str) -> str | None:
    if contract.is_legal(from_state or None, event, to_state):
        return None
    try:
        expected = contract.next_state(from_state or None, event)
        return f"event {event!r} from {from_state!r} leads to {expected.value!r}, not {to_state!r}"
    except contract.IllegalTransition as exc:
        return str(exc)


_NOT_HANDOFF: Final = CheckResult(is_handoff=False)
_HANDOFF_OK: Final = CheckResult(is_handoff=True)


def check_handoff_span(
    attrs: dict[str, str], *, tenant: str, resource_tenant: str = ""
) -> CheckResult:
    """Check a span's encoded attributes (after type checks) against the contract.

    A span is a handoff transition when it carries any identifying attribute
    (semconv.REQUIRED_ON_EVERY); other spans pass through untouched (is_handoff False).
    The tenant a transition claims is its own `handoff.tenant`, else `resource_tenant`
    (its resource's); a resource-only claim comes back as `claim`, to be stored.
    """
    present = [n for n in _IDENTIFYING if n in attrs]
    if not present:
        return _NOT_HANDOFF
    event = attrs.get(semconv.EVENT, "")
    if len(present) != len(_IDENTIFYING) or event == contract.CREATE_EVENT:
        missing = [n for n in _IDENTIFYING if n not in attrs]
        if event == contract.CREATE_EVENT:
            missing += [n for n in semconv.REQUIRED_ON_CREATE if n not in attrs]
        if missing:
            return CheckResult(
                is_handoff=False,
                reject_reason=f"missing required attribute(s): {', '.join(missing)}",
            )
    for name in _NON_EMPTY:
        if not attrs[name]:
            return CheckResult(
                is_handoff=False, reject_reason=f"attribute {name} must not be empty"
            )
    flags: dict[str, str] | None = None
    reason = _illegal_reason(attrs[semconv.FROM_STATE], event, attrs[semconv.TO_STATE])
    if reason is not None:
        flags = {semconv.VALID: "false"}
        if not attrs.get(semconv.INVALID_REASON):
            flags[semconv.INVALID_REASON] = reason
    claimed = attrs.get(semconv.TENANT)
    claim = ""
    if not claimed and resource_tenant:
        claimed = claim = resource_tenant
    if claimed and claimed != tenant:
        flags = flags or {}
        flags[TENANT_MISMATCH] = "true"
    if flags or claim:
        return CheckResult(is_handoff=True, flags=flags, claim=claim)
    return _HANDOFF_OK
