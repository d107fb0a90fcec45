"""The envelope's message fields: the sender's id of the message, how long it stays
deliverable, whether the receiver must acknowledge it, where a large payload is kept.

Pure checks and the `create` span's attributes, apart from collector/envelope.py (which
calls `check_message_fields` from its own validation). What the platform makes of them:
`ack_missing` (docs/metrics.md): a message with `requires_ack` that no `accept` or `reject`
acknowledged within `ttl_s` seconds of its create.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

from collector import semconv as sc
from collector._errors import EnvelopeError

if TYPE_CHECKING:
    from collector._redact import InputFilter

__all__ = ["MESSAGE_FIELDS", "check_message_fields", "message_attributes"]

#: envelope field -> its `handoff.message.*` attribute on the create span
MESSAGE_FIELDS: Final = {
    "message_id": sc.MESSAGE_ID,
    "ttl_s": sc.MESSAGE_TTL_S,
    "requires_ack": sc.MESSAGE_REQUIRES_ACK,
    "payload_ref": sc.MESSAGE_PAYLOAD_REF,
}
#: longest id or reference kept, characters (an id, not a payload)
MAX_ID_CHARS: Final = 4096


def check_message_fields(message_id: Any, ttl_s: Any, requires_ack: Any, payload_ref: Any) -> None:
    """EnvelopeError naming the field unless: message_id and payload_ref are None or
    non-empty strings (at most MAX_ID_CHARS), ttl_s None or an int >= 1 (seconds),
    requires_ack None or a bool. An acknowledgement is due within ttl_s, so requires_ack
    true without ttl_s is refused (nothing would say when the ack is late)."""
    for name, v in (("message_id", message_id), ("payload_ref", payload_ref)):
        if v is None:
            continue
        if not isinstance(v, str) or not v.strip():
            raise EnvelopeError(name, f"must be a non-empty string when given, got {v!r}")
        if len(v) > MAX_ID_CHARS:
            raise EnvelopeError(name, f"longer than {MAX_ID_CHARS} characters")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int)):
        raise EnvelopeError("ttl_s", f"must be an integer (seconds), got {type(ttl_s).__name__}")
    if ttl_s is not None and ttl_s < 1:
        raise EnvelopeError("ttl_s", f"must be positive (seconds), got {ttl_s}")
    if requires_ack is not None and not isinstance(requires_ack, bool):
        raise EnvelopeError(
            "requires_ack", f"must be a bool, got {type(requires_ack).__name__} {requires_ack!r}"
        )
    if requires_ack and ttl_s is None:
        raise EnvelopeError(
            "requires_ack", "needs ttl_s: the seconds within which the accept or reject is due"
        )


class MessageFields(Protocol):
    """What message_attributes reads: an Envelope (not imported: the envelope imports this
    module)."""

    @property
    def message_id(self) -> str | None: ...
    @property
    def ttl_s(self) -> int | None: ...
    @property
    def requires_ack(self) -> bool | None: ...
    @property
    def payload_ref(self) -> str | None: ...


def message_attributes(env: MessageFields, filt: InputFilter) -> dict[str, Any]:
    """The create span's `handoff.message.*` attributes: the fields that are set (an explicit
    requires_ack false is kept). payload_ref passes the input filter: a presigned URL
    carries its credential in the query."""
    out: dict[str, Any] = {}
    for name, attr in MESSAGE_FIELDS.items():
        v = getattr(env, name)
        if v is not None:
            out[attr] = filt.redact_text(v) if name == "payload_ref" else v
    return out
