"""A message the receiver's strict tracer refuses, recorded as its `reject`.

A strict `HandoffTracer` raises `IllegalTransition` on an event the state table does not
allow (a message to a handoff that already ended, a step out of order). When that tracer is
the receiver (its actor is the envelope's `to_agent`), the refusal is also a fact the
platform should see: before raising, the tracer emits a `reject` carrying
`handoff.error_code` = REFUSAL_CODE and the refused event in `handoff.invalid_reason`.

That reject is always flagged `handoff.valid=false`: after a terminal state no reject is
legal, and from `created` a valid one would end the handoff as `rejected`, while the
receiver refused one message, not the handoff. So it never moves the handoff's state; the
analytics count it under `invalid_transition`, as a lenient tracer's flagged event is. A
sender's own illegal call is its own bug, not a refused message: it only raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from collector import semconv as sc
from collector._topology import is_replaying

__all__ = ["REFUSAL_CODE", "refused_message_attributes"]

#: the refusal's `handoff.error_code`: the message conflicts with the handoff's current
#: state (HTTP 409's meaning; the A2A adapter maps TaskNotCancelableError to it too)
REFUSAL_CODE: Final = "conflict"


def refused_message_attributes(
    base: Mapping[str, Any],
    state: str,
    event: str,
    reason: object,
    consumer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The attributes of the `reject` recording that the receiver refused `event` in
    `state` (`reason`: the IllegalTransition, or its text): `base` (the handoff's identity
    and actor), flagged valid=false, error_code REFUSAL_CODE, `consumer` (its supported
    versions and the envelope's unknown fields, as on any reject of that tracer), and
    `handoff.replay` inside replaying()."""
    a = dict(base)
    if consumer:
        for k, v in consumer.items():
            a.setdefault(k, v)
    a.update(
        {
            sc.EVENT: "reject",
            sc.GEN_AI_OPERATION_NAME: "handoff.reject",
            sc.FROM_STATE: state,
            sc.TO_STATE: "rejected",
            sc.VALID: False,
            sc.INVALID_REASON: f"refused {event!r}: {reason}",
            sc.ERROR_CODE: REFUSAL_CODE,
        }
    )
    if is_replaying():
        a[sc.REPLAY] = True
    return a
