"""Validation of one span's handoff attributes against the wire contract. Pure.

Types and required attributes come from collector.semconv.WIRE_ATTRIBUTES; legality from
collector.contract. A span breaking the *shape* (wrong type, required attribute missing)
is rejected; a well-formed but *illegal* transition is kept and flagged
(`handoff.valid=false`, `handoff.invalid_reason`), as is a `handoff.tenant` claim that
differs from the credential's tenant (`handoff.tenant_mismatch=true`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from collector import contract, semconv

__all__ = ["TENANT_MISMATCH", "CheckResult", "check_handoff_span"]

#: Span attribute ingest adds when a span's `handoff.tenant` claim differs from the
#: credential's tenant (the stored tenant is always the credential's).
TENANT_MISMATCH: Final = "handoff.tenant_mismatch"

_TYPES: Final = {a.name: a.type for a in semconv.WIRE_ATTRIBUTES}
_TAG_FOR: Final = {"string": "string", "int": "int", "bool": "bool", "string[]": "array"}
_IDENTIFYING: Final = frozenset(semconv.REQUIRED_ON_EVERY)


@dataclass(frozen=True, slots=True)
class CheckResult:
    is_handoff: bool
    reject_reason: str | None = None
    flags: dict[str, str] | None = None  # attributes to add to the stored span


def _type_problem(name: str, tag: str, value: Any) -> str | None:
    want = _TYPES.get(name)
    if want is None:
        return None
    if tag != _TAG_FOR[want]:
        return f"attribute {name} must be {want}, got {tag}"
    if want == "string[]" and not all(isinstance(v, str) for v in value):
        return f"attribute {name} must be string[], got an array with non-string items"
    return None


def check_handoff_span(
    attrs: dict[str, str], typed: dict[str, tuple[str, Any]], *, tenant: str
) -> CheckResult:
    """Check a span's `handoff.*` attributes. `typed` maps name -> (type tag, raw value).

    A span is a handoff transition when it carries any identifying attribute
    (semconv.REQUIRED_ON_EVERY); other spans pass through untouched (is_handoff False),
    except for type checks of the wire attributes they do carry.
    """
    for name, (tag, value) in typed.items():
        problem = _type_problem(name, tag, value)
        if problem:
            return CheckResult(is_handoff=False, reject_reason=problem)
    if not _IDENTIFYING.intersection(typed):
        return CheckResult(is_handoff=False)
    missing = [n for n in semconv.REQUIRED_ON_EVERY if n not in typed]
    event = attrs.get(semconv.EVENT, "")
    if event == contract.CREATE_EVENT:
        missing += [n for n in semconv.REQUIRED_ON_CREATE if n not in typed]
    if missing:
        return CheckResult(
            is_handoff=False, reject_reason=f"missing required attribute(s): {', '.join(missing)}"
        )
    for name in (semconv.HANDOFF_ID, semconv.TASK_ID, semconv.EVENT, semconv.TO_STATE):
        if not attrs[name]:
            return CheckResult(
                is_handoff=False, reject_reason=f"attribute {name} must not be empty"
            )
    flags: dict[str, str] = {}
    from_state = attrs[semconv.FROM_STATE]
    to_state = attrs[semconv.TO_STATE]
    if not contract.is_legal(from_state or None, event, to_state):
        try:
            expected = contract.next_state(from_state or None, event)
            reason = (
                f"event {event!r} from {from_state!r} leads to {expected.value!r}, not {to_state!r}"
            )
        except contract.IllegalTransition as exc:
            reason = str(exc)
        flags[semconv.VALID] = "false"
        if not attrs.get(semconv.INVALID_REASON):
            flags[semconv.INVALID_REASON] = reason
    claimed = attrs.get(semconv.TENANT, "")
    if claimed and claimed != tenant:
        flags[TENANT_MISMATCH] = "true"
    return CheckResult(is_handoff=True, flags=flags or None)
