"""The handoff envelope (`aa-handoff/v1`): what one agent hands to another, validated.

The envelope travels between agents as a JSON-able dict (`to_wire` / `from_wire`). The
tracer adds W3C `traceparent` and the current state beside it (see `Handoff.to_wire`), so
`from_wire` ignores those transport keys.

Forward compatibility: unknown optional fields from a newer minor version are kept in
`extra` (and re-emitted by `to_wire`) but otherwise ignored; a missing required field or an
unknown MAJOR protocol version (`aa-handoff/v2`) is refused with an `EnvelopeError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from collector import semconv
from collector.contract import PROTOCOL

__all__ = [
    "MODES",
    "PROTOCOL_MAJOR",
    "REQUIRED_FIELDS",
    "TOPOLOGIES",
    "TRANSPORT_KEYS",
    "Envelope",
    "EnvelopeError",
    "EvidenceRef",
]

MODES: Final = frozenset(semconv.MODES)
TOPOLOGIES: Final = frozenset(semconv.TOPOLOGIES)
#: The protocol major version this code speaks; minor versions (`aa-handoff/v1.3`) are accepted.
PROTOCOL_MAJOR: Final = 1
REQUIRED_FIELDS: Final = ("task_id", "handoff_id", "from_agent", "to_agent", "mode")
#: Keys the tracer puts beside the envelope on the wire; not envelope fields, never in `extra`.
TRANSPORT_KEYS: Final = frozenset({"traceparent", "tracestate", "state"})

_PROTOCOL_RE: Final = re.compile(r"aa-handoff/v([0-9]{1,6})(?:\.([0-9]{1,6}))?")
#: Upper bound on free-text fields (objective, reply_contract, ...), in characters.
MAX_TEXT_CHARS: Final = 1_000_000


class EnvelopeError(ValueError):
    """A bad envelope: `field` names the offending field, `reason` says what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"envelope field {field!r}: {reason}")


@dataclass(frozen=True, slots=True)
class EvidenceRef:
    """One piece of evidence the receiver may rely on: an id, what it claims, when valid.

    Read from the wire, unknown keys of an evidence item are dropped (forward compatibility
    keeps unknown fields at the envelope's top level only)."""

    id: str
    claim: str | None = None
    valid_at: str | None = None  # ISO-8601 time, as given; not parsed

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise EnvelopeError(
                "evidence_refs", f"evidence id must be a non-empty string, got {self.id!r}"
            )
        for name in ("claim", "valid_at"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise EnvelopeError(
                    "evidence_refs", f"{name} must be a string, got {type(v).__name__}"
                )

    def to_wire(self) -> dict[str, str]:
        d = {"id": self.id}
        if self.claim is not None:
            d["claim"] = self.claim
        if self.valid_at is not None:
            d["valid_at"] = self.valid_at
        return d

    @classmethod
    def coerce(cls, value: Any) -> EvidenceRef:
        """An EvidenceRef from itself, a bare id string, or a wire dict; EnvelopeError otherwise."""
        if isinstance(value, EvidenceRef):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            if "id" not in value:
                raise EnvelopeError("evidence_refs", "evidence item has no 'id'")
            return cls(value["id"], value.get("claim"), value.get("valid_at"))
        raise EnvelopeError(
            "evidence_refs",
            f"evidence item must be an id string or an object, got {type(value).__name__}",
        )


def _str_field(name: str, value: Any, *, required: bool) -> None:
    if value is None:
        if required:
            raise EnvelopeError(name, "required field missing")
        return
    if not isinstance(value, str):
        raise EnvelopeError(name, f"must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise EnvelopeError(name, "must be a non-empty string")
    if len(value) > MAX_TEXT_CHARS:
        raise EnvelopeError(name, f"longer than {MAX_TEXT_CHARS} characters")


def _int_field(name: str, value: Any, *, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnvelopeError(name, f"must be an integer, got {type(value).__name__}")
    if value < minimum:
        word = "positive" if minimum == 1 else f">= {minimum}"
        raise EnvelopeError(name, f"must be {word}, got {value}")


_JSON: Final = json.JSONEncoder(allow_nan=False)


def _json_check(name: str, value: Any) -> None:
    """EnvelopeError unless `value` is plain JSON (the wire form must survive json.dumps)."""
    try:
        _JSON.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EnvelopeError(name, f"must be JSON-serializable: {exc}") from None


def _protocol_major(protocol: Any) -> int:
    if not isinstance(protocol, str):
        raise EnvelopeError("protocol", f"must be a string, got {type(protocol).__name__}")
    m = _PROTOCOL_RE.fullmatch(protocol)
    if not m:
        raise EnvelopeError(
            "protocol", f"unknown protocol {protocol!r}; expected 'aa-handoff/v<major>'"
        )
    return int(m.group(1))


@dataclass(frozen=True, slots=True)
class Envelope:
    """A validated `aa-handoff/v1` envelope.

    Required: task_id, handoff_id, from_agent, to_agent (non-empty strings) and mode
    (delegate|consult|transfer|escalate). Lists given for capabilities / evidence_refs are
    stored as tuples; evidence items may be bare id strings. deadline_ms is a budget in
    milliseconds (> 0); max_tool_calls, state_version and fence_token are integers >= 0.
    `extra` holds unknown optional fields read from a newer wire version; they are kept and
    re-emitted but never interpreted. Raises EnvelopeError(field, reason) on bad input.
    """

    task_id: str
    handoff_id: str
    from_agent: str
    to_agent: str
    mode: str
    protocol: str = PROTOCOL
    contract_version: str | None = None
    objective: str | None = None
    constraints: Mapping[str, Any] | None = field(default=None, hash=False)
    parent_state: str | None = None
    evidence_refs: tuple[EvidenceRef, ...] = ()
    capabilities: tuple[str, ...] = ()
    idempotency_key: str | None = None
    deadline_ms: int | None = None
    max_tool_calls: int | None = None
    reply_contract: str | None = None
    topology: str = "in_process"
    causation_id: str | None = None
    state_version: int | None = None
    fence_token: int | None = None
    payload_hash: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in REQUIRED_FIELDS:
            _str_field(name, getattr(self, name), required=True)
        if self.mode not in MODES:
            raise EnvelopeError(
                "mode", f"unknown mode {self.mode!r}; expected one of {', '.join(semconv.MODES)}"
            )
        major = _protocol_major(self.protocol)
        if major != PROTOCOL_MAJOR:
            raise EnvelopeError(
                "protocol",
                f"unsupported major version {self.protocol!r}; this shim speaks aa-handoff/v{PROTOCOL_MAJOR}",
            )
        if not isinstance(self.topology, str) or self.topology not in TOPOLOGIES:
            raise EnvelopeError(
                "topology",
                f"unknown topology {self.topology!r}; expected one of {', '.join(semconv.TOPOLOGIES)}",
            )
        for name in (
            "contract_version",
            "objective",
            "parent_state",
            "idempotency_key",
            "reply_contract",
            "causation_id",
            "payload_hash",
        ):
            _str_field(name, getattr(self, name), required=False)
        _int_field("deadline_ms", self.deadline_ms, minimum=1)
        for name in ("max_tool_calls", "state_version", "fence_token"):
            _int_field(name, getattr(self, name), minimum=0)

        caps = self.capabilities
        if not isinstance(caps, (list, tuple)):
            raise EnvelopeError(
                "capabilities", f"must be a list of strings, got {type(caps).__name__}"
            )
        for c in caps:
            if not isinstance(c, str) or not c:
                raise EnvelopeError(
                    "capabilities", f"every capability must be a non-empty string, got {c!r}"
                )
        if isinstance(caps, list):
            object.__setattr__(self, "capabilities", tuple(caps))

        refs = self.evidence_refs
        if not isinstance(refs, (list, tuple)):
            raise EnvelopeError("evidence_refs", f"must be a list, got {type(refs).__name__}")
        if not all(type(r) is EvidenceRef for r in refs) or isinstance(refs, list):
            object.__setattr__(self, "evidence_refs", tuple(EvidenceRef.coerce(r) for r in refs))

        if self.constraints is not None:
            if not isinstance(self.constraints, Mapping):
                raise EnvelopeError(
                    "constraints",
                    f"must be an object (dict), got {type(self.constraints).__name__}",
                )
            for k in self.constraints:
                if not isinstance(k, str):
                    raise EnvelopeError("constraints", f"keys must be strings, got {k!r}")
            _json_check("constraints", self.constraints)
            # a shallow copy: the caller mutating its dict later does not change the envelope
            object.__setattr__(self, "constraints", dict(self.constraints))
        if not isinstance(self.extra, Mapping):
            raise EnvelopeError("extra", f"must be a dict, got {type(self.extra).__name__}")
        clash = _FIELD_NAMES.intersection(self.extra)
        if clash:
            raise EnvelopeError("extra", f"holds known field(s) {', '.join(sorted(clash))}")
        if self.extra:
            _json_check("extra", self.extra)

    # -- wire -------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The envelope as a JSON-able dict: fields that are set, plus `extra` kept verbatim."""
        d: dict[str, Any] = dict(self.extra)
        for name in _FIELD_ORDER:
            v = getattr(self, name)
            if v is None:
                continue
            if name == "capabilities":
                if v:
                    d[name] = list(v)
            elif name == "evidence_refs":
                if v:
                    d[name] = [r.to_wire() for r in v]
            elif name == "constraints":
                d[name] = dict(v)
            else:
                d[name] = v
        return d

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Envelope:
        """Parse a wire dict. Unknown keys go to `extra`; transport keys (traceparent, state)
        are ignored. Raises EnvelopeError for a missing required field, an unknown major
        protocol version, or any invalid field."""
        if not isinstance(wire, Mapping):
            raise EnvelopeError("envelope", f"must be an object (dict), got {type(wire).__name__}")
        protocol = wire.get("protocol", PROTOCOL)
        # The protocol decides how to read everything else, so it is checked first.
        if _protocol_major(protocol) != PROTOCOL_MAJOR:
            raise EnvelopeError(
                "protocol",
                f"unsupported major version {protocol!r}; this shim speaks aa-handoff/v{PROTOCOL_MAJOR}",
            )
        for name in REQUIRED_FIELDS:
            if name not in wire or wire[name] is None:
                raise EnvelopeError(name, "required field missing")
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in wire.items():
            if k in _FIELD_NAMES:
                known[k] = v
            elif k not in TRANSPORT_KEYS:
                extra[k] = v
        for name in ("capabilities", "evidence_refs"):
            v = known.get(name)
            if v is None:
                known.pop(name, None)
            elif not isinstance(v, list | tuple):
                raise EnvelopeError(name, f"must be a list, got {type(v).__name__}")
        if known.get("topology") is None:
            known.pop("topology", None)
        return cls(**known, extra=extra)


_FIELD_ORDER: Final = tuple(f for f in Envelope.__dataclass_fields__ if f != "extra")
_FIELD_NAMES: Final = frozenset(_FIELD_ORDER)
