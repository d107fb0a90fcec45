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
from collector._errors import EnvelopeError, utc_time_problem
from collector._message import check_message_fields
from collector._policy import EvidencePolicy, must_return_fields, split_reply_contract
from collector.contract import PROTOCOL

__all__ = [
    "MODES",
    "PROTOCOL_MAJOR",
    "REQUIRED_FIELDS",
    "TOPOLOGIES",
    "TRANSPORT_KEYS",
    "Envelope",
    "EnvelopeError",
    "EvidencePolicy",
    "EvidenceRef",
    "Grant",
    "utc_time_problem",
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


@dataclass(frozen=True, slots=True)
class EvidenceRef:
    """One piece of evidence the receiver may rely on: an id, what it claims, when valid.

    Read from the wire, unknown keys of an evidence item are dropped (forward compatibility
    keeps unknown fields at the envelope's top level only)."""

    id: str
    claim: str | None = None
    valid_at: str | None = None  # ISO-8601 UTC time, kept as given

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise EnvelopeError(
                "evidence_refs", f"evidence id must be a non-empty string, got {self.id!r}"
            )
        if self.claim is not None and not isinstance(self.claim, str):
            raise EnvelopeError(
                "evidence_refs.claim", f"must be a string, got {type(self.claim).__name__}"
            )
        if self.valid_at is not None:
            problem = utc_time_problem(self.valid_at)
            if problem is not None:
                raise EnvelopeError("evidence_refs.valid_at", problem)

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


@dataclass(frozen=True, slots=True)
class Grant:
    """The capability grant a handoff runs under: who asked (`caller`), on whose behalf
    (`subject`), for which `tenant`, which `capabilities` on which `resources`, until when
    (`expires_at`, ISO-8601 UTC) and on which `approval` (an approval id or reference).

    Every field is optional; strings must be non-empty when given, lists are stored as
    tuples of non-empty strings. Read from the wire, unknown keys of the grant are dropped.
    Raises EnvelopeError naming the field as `grant.<field>`.
    """

    caller: str | None = None
    subject: str | None = None
    tenant: str | None = None
    capabilities: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    expires_at: str | None = None
    approval: str | None = None

    def __post_init__(self) -> None:
        for name in ("caller", "subject", "tenant", "approval"):
            v = getattr(self, name)
            _str_field(f"grant.{name}", v, required=False)
            if v is not None and not v.strip():
                raise EnvelopeError(f"grant.{name}", "must be a non-empty string when given")
        for name in ("capabilities", "resources"):
            object.__setattr__(self, name, _str_list(f"grant.{name}", getattr(self, name)))
        if self.expires_at is not None:
            problem = utc_time_problem(self.expires_at)
            if problem is not None:
                raise EnvelopeError("grant.expires_at", problem)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for name in _GRANT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, tuple):
                if v:
                    d[name] = list(v)
            elif v is not None:
                d[name] = v
        return d

    @classmethod
    def coerce(cls, value: Any) -> Grant:
        """A Grant from itself or a wire dict (unknown keys dropped); EnvelopeError otherwise."""
        if isinstance(value, Grant):
            return value
        if not isinstance(value, Mapping):
            raise EnvelopeError("grant", f"must be an object (dict), got {type(value).__name__}")
        kw = {k: value[k] for k in _GRANT_FIELDS if value.get(k) is not None}
        for name in ("capabilities", "resources"):
            if name in kw and not isinstance(kw[name], list | tuple):
                raise EnvelopeError(
                    f"grant.{name}", f"must be a list of strings, got {type(kw[name]).__name__}"
                )
        return cls(**kw)


_GRANT_FIELDS: Final = (
    "caller",
    "subject",
    "tenant",
    "capabilities",
    "resources",
    "expires_at",
    "approval",
)


def _coerce_refs(refs: Any) -> list[EvidenceRef]:
    """EvidenceRefs of a list; an error names the item: `evidence_refs[2].valid_at`."""
    out = []
    for i, r in enumerate(refs):
        try:
            out.append(EvidenceRef.coerce(r))
        except EnvelopeError as exc:
            field = exc.field.replace("evidence_refs", f"evidence_refs[{i}]", 1)
            raise EnvelopeError(field, exc.reason, exc.code) from None
    return out


def _str_list(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise EnvelopeError(name, f"must be a list of strings, got {type(value).__name__}")
    for v in value:
        if not isinstance(v, str) or not v:
            raise EnvelopeError(name, f"every item must be a non-empty string, got {v!r}")
    return tuple(value)


def _str_field(name: str, value: Any, *, required: bool) -> None:
    if value is None:
        if required:
            raise EnvelopeError(name, "required field missing", "missing_required_field")
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
            "protocol",
            f"unknown protocol {protocol!r}; expected 'aa-handoff/v<major>'",
            "incompatible_protocol",
        )
    return int(m.group(1))


@dataclass(frozen=True, slots=True)
class Envelope:
    """A validated `aa-handoff/v1` envelope.

    Required: task_id, handoff_id, from_agent, to_agent (non-empty strings) and mode
    (delegate|consult|transfer|escalate). Lists given for capabilities / evidence_refs are
    stored as tuples; evidence items may be bare id strings. deadline_ms is a budget in
    milliseconds (> 0); max_tool_calls, state_version and fence_token are integers >= 0.
    `attempt` (>= 1; None reads as 1) numbers the attempts of one task at one target;
    `retry_of` names the handoff_id this attempt retries (then attempt >= 2). `grant` is the
    capability grant (a Grant, or its wire dict). Evidence `valid_at` and grant
    `expires_at` are ISO-8601 UTC times. `message_kind` is command|event|receipt;
    `schema_version` (int >= 0) the envelope schema the sender wrote.
    `evidence_policy` (an EvidencePolicy, or its wire dict) and `must_return` (field names)
    are what the platform checks the result against; on the wire `must_return` may also
    come inside a structured `reply_contract` object (`{"text"?, "must_return"?}`).
    The message fields (collector/_message.py): `message_id` and `payload_ref` non-empty
    strings, `ttl_s` seconds (int >= 1) it stays deliverable, `requires_ack` (bool) that the
    receiver accepts or rejects it within ttl_s (then ttl_s is required).
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
    attempt: int | None = None
    retry_of: str | None = None
    grant: Grant | None = None
    state_version: int | None = None
    fence_token: int | None = None
    payload_hash: str | None = None
    message_kind: str | None = None
    schema_version: int | None = None
    evidence_policy: EvidencePolicy | None = None
    must_return: tuple[str, ...] = ()
    message_id: str | None = None
    ttl_s: int | None = None
    requires_ack: bool | None = None
    payload_ref: str | None = None
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
                "incompatible_protocol",
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
            "retry_of",
            "payload_hash",
        ):
            _str_field(name, getattr(self, name), required=False)
        _int_field("deadline_ms", self.deadline_ms, minimum=1)
        _int_field("attempt", self.attempt, minimum=1)
        if self.retry_of is not None:
            if not self.retry_of.strip():
                raise EnvelopeError("retry_of", "must be a non-empty string when given")
            if self.retry_of == self.handoff_id:
                raise EnvelopeError("retry_of", "names this handoff itself; a retry is a new id")
            if self.attempt is not None and self.attempt < 2:
                raise EnvelopeError(
                    "attempt", f"a retry (retry_of set) is attempt 2 or later, got {self.attempt}"
                )
        if self.grant is not None and not isinstance(self.grant, Grant):
            object.__setattr__(self, "grant", Grant.coerce(self.grant))
        if self.evidence_policy is not None:
            object.__setattr__(self, "evidence_policy", EvidencePolicy.coerce(self.evidence_policy))
        object.__setattr__(self, "must_return", must_return_fields(self.must_return))
        for name in ("max_tool_calls", "state_version", "fence_token", "schema_version"):
            _int_field(name, getattr(self, name), minimum=0)
        check_message_fields(self.message_id, self.ttl_s, self.requires_ack, self.payload_ref)
        if self.message_kind is not None and self.message_kind not in semconv.MESSAGE_KINDS:
            raise EnvelopeError(
                "message_kind",
                f"unknown kind {self.message_kind!r}; expected one of "
                + ", ".join(semconv.MESSAGE_KINDS),
            )

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
            object.__setattr__(self, "evidence_refs", tuple(_coerce_refs(refs)))

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
            elif name in ("grant", "evidence_policy"):
                d[name] = v.to_wire()
            elif name == "must_return":
                if v:
                    d[name] = list(v)
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
                "incompatible_protocol",
            )
        for name in REQUIRED_FIELDS:
            if name not in wire or wire[name] is None:
                raise EnvelopeError(name, "required field missing", "missing_required_field")
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
        _read_reply_contract(known)
        return cls(**known, extra=extra)


def _read_reply_contract(known: dict[str, Any]) -> None:
    """In place: a structured `reply_contract` object split into its text and
    `must_return` (which must agree with a top-level `must_return`); a null must_return
    dropped."""
    text, nested = split_reply_contract(known.get("reply_contract"))
    if "reply_contract" in known:
        known["reply_contract"] = text
    top = known.pop("must_return", None)
    if top is not None and nested is not None and tuple(top) != nested:
        raise EnvelopeError("must_return", "differs from reply_contract.must_return")
    if top is not None or nested is not None:
        known["must_return"] = top if top is not None else nested


_FIELD_ORDER: Final = tuple(f for f in Envelope.__dataclass_fields__ if f != "extra")
_FIELD_NAMES: Final = frozenset(_FIELD_ORDER)
