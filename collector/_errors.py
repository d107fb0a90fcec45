"""The envelope's refusal error and its time check, apart from collector/envelope.py so the
envelope's parts (collector/_policy.py) raise the same error without importing the envelope.

`collector.envelope` re-exports both names: import them from there.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

__all__ = ["EnvelopeError", "utc_time_problem"]


class EnvelopeError(ValueError):
    """A bad envelope: `field` names the offending field, `reason` says what is wrong, `code`
    is the `handoff.error_code` of the receiver's refusal: `incompatible_protocol`,
    `missing_required_field` or `invalid_envelope` (the default)."""

    def __init__(self, field: str, reason: str, code: str = "invalid_envelope") -> None:
        self.field = field
        self.reason = reason
        self.code = code
        super().__init__(f"envelope field {field!r}: {reason}")


_ZERO: Final = timedelta(0)


def utc_time_problem(value: Any) -> str | None:
    """None when `value` is an ISO-8601 time in UTC (`2026-12-01T10:00:00Z` or `+00:00`);
    otherwise what is wrong with it, as a phrase to follow the field's name."""
    if not isinstance(value, str):
        return f"not an ISO-8601 UTC time: must be a string, got {type(value).__name__}"
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return f"not an ISO-8601 UTC time: {value!r}"
    if "T" not in value or t.utcoffset() != _ZERO:
        return f"not an ISO-8601 UTC time (date, time and Z or +00:00 expected): {value!r}"
    return None
