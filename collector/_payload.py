"""`handoff.payload_hash`: a digest of what a handoff asks for, so the same idempotency key
sent with a changed payload is told from a plain resend (analytics' idempotency_conflict).

Pure functions, no I/O. The digest is `sha256:<hex>` of the payload's canonical JSON (sorted
keys, no white space, UTF-8: `foundation.integrity.canonical_json`, the one definition the
row hashes use too). `HandoffTracer.create` stamps `envelope_payload_hash(envelope)` on
the span unless the envelope carries a `payload_hash` of its own: a caller-given hash wins.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

from foundation.integrity import canonical_json

if TYPE_CHECKING:
    from collector.envelope import Envelope

__all__ = ["PAYLOAD_FIELDS", "envelope_payload", "envelope_payload_hash", "payload_hash"]

#: The envelope fields the default payload hash covers (the payload, not the routing).
PAYLOAD_FIELDS: Final = (
    "objective",
    "constraints",
    "parent_state",
    "capabilities",
    "evidence_refs",
)


def payload_hash(payload: Any) -> str:
    """`sha256:<64 hex>` of the canonical JSON of `payload` (a JSON-able value). Dict key
    order and the caller's white space do not change it; list order does."""
    return "sha256:" + hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def envelope_payload(env: Envelope) -> dict[str, Any]:
    """The object the default hash covers: every name of PAYLOAD_FIELDS, raw (before the
    input filter); an unset field is null, an empty list `[]`; evidence refs in their wire
    form (`{id, claim?, valid_at?}`), lists in the envelope's order."""
    return {
        "objective": env.objective,
        "constraints": None if env.constraints is None else dict(env.constraints),
        "parent_state": env.parent_state,
        "capabilities": list(env.capabilities),
        "evidence_refs": [r.to_wire() for r in env.evidence_refs],
    }


def envelope_payload_hash(env: Envelope) -> str:
    """The envelope's own `payload_hash` when given, else `payload_hash(envelope_payload(env))`."""
    if env.payload_hash is not None:
        return env.payload_hash
    return payload_hash(envelope_payload(env))
