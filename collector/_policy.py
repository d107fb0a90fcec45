"""What an envelope asks of the result, structured so the platform can check it: the
evidence policy (`EvidencePolicy`) and the reply contract's `must_return` field names.

Pure: validation, the wire form and the `create` span's attributes. The checks themselves
run in analytics (docs/metrics.md, "Evidence checks"): the emitter's `evidence.valid` is a
claim the platform verifies against these, not the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from collector import semconv as sc
from collector._errors import EnvelopeError, utc_time_problem

__all__ = [
    "POLICY_FIELDS",
    "EvidencePolicy",
    "contract_attributes",
    "must_return_fields",
    "split_reply_contract",
]

#: the wire keys of an evidence policy, in their order
POLICY_FIELDS: Final = ("valid_after", "valid_before", "min_refs", "require_claims")
#: the wire keys of a structured reply contract (`reply_contract` given as an object)
_CONTRACT_KEYS: Final = frozenset({"text", "must_return"})


@dataclass(frozen=True, slots=True)
class EvidencePolicy:
    """The evidence a result must carry, checked by the platform against the result's refs:
    each ref's `valid_at` at or after `valid_after` (inclusive) and before `valid_before`
    (exclusive), both ISO-8601 UTC and optional (`valid_after` earlier than `valid_before`
    when both); at least `min_refs` refs (int >= 0, None: no minimum); with
    `require_claims`, a claim on every ref. Read from the wire, unknown keys are dropped.
    Raises EnvelopeError naming `evidence_policy.<field>`.
    """

    valid_after: str | None = None
    valid_before: str | None = None
    min_refs: int | None = None
    require_claims: bool = False

    def __post_init__(self) -> None:
        for name in ("valid_after", "valid_before"):
            v = getattr(self, name)
            if v is not None and (problem := utc_time_problem(v)) is not None:
                raise EnvelopeError(f"evidence_policy.{name}", problem)
        if self.valid_after is not None and self.valid_before is not None:
            after = datetime.fromisoformat(self.valid_after)
            before = datetime.fromisoformat(self.valid_before)
            if after >= before:
                raise EnvelopeError(
                    "evidence_policy.valid_before",
                    f"must be after valid_after ({self.valid_after}), got {self.valid_before}",
                )
        m = self.min_refs
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise EnvelopeError("evidence_policy.min_refs", f"must be an integer >= 0, got {m!r}")
        if not isinstance(self.require_claims, bool):
            raise EnvelopeError(
                "evidence_policy.require_claims",
                f"must be true or false, got {self.require_claims!r}",
            )

    def to_wire(self) -> dict[str, Any]:
        """The policy as a JSON-able dict: the fields that are set (require_claims when true)."""
        d: dict[str, Any] = {}
        for name in ("valid_after", "valid_before", "min_refs"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        if self.require_claims:
            d["require_claims"] = True
        return d

    def attributes(self) -> dict[str, Any]:
        """The `create` span's `handoff.evidence_policy.*` attributes: the fields that are
        set, and `require_claims` always (so a declared policy shows even when empty)."""
        a: dict[str, Any] = {}
        for name, attr in (
            ("valid_after", sc.EVIDENCE_POLICY_VALID_AFTER),
            ("valid_before", sc.EVIDENCE_POLICY_VALID_BEFORE),
            ("min_refs", sc.EVIDENCE_POLICY_MIN_REFS),
        ):
            v = getattr(self, name)
            if v is not None:
                a[attr] = v
        a[sc.EVIDENCE_POLICY_REQUIRE_CLAIMS] = self.require_claims
        return a

    @classmethod
    def coerce(cls, value: Any) -> EvidencePolicy:
        """An EvidencePolicy from itself or a wire dict (unknown keys dropped, null = unset);
        EnvelopeError otherwise."""
        if isinstance(value, EvidencePolicy):
            return value
        if not isinstance(value, Mapping):
            raise EnvelopeError(
                "evidence_policy", f"must be an object (dict), got {type(value).__name__}"
            )
        return cls(**{k: value[k] for k in POLICY_FIELDS if value.get(k) is not None})


def must_return_fields(value: Any, name: str = "must_return") -> tuple[str, ...]:
    """The reply contract's field names as a tuple (from a list or tuple of non-empty
    strings, in the given order); EnvelopeError naming `name` otherwise."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise EnvelopeError(name, f"must be a list of field names, got {type(value).__name__}")
    out = tuple(value)
    for v in out:
        if not isinstance(v, str) or not v.strip():
            raise EnvelopeError(name, f"every field name must be a non-empty string, got {v!r}")
    return out


def split_reply_contract(value: Any) -> tuple[str | None, tuple[str, ...] | None]:
    """A wire `reply_contract`: a string (the free-text form) -> (text, None); an object
    `{"text"?: str, "must_return"?: [names]}` (the structured form) -> (text, names).
    EnvelopeError for an object with other keys; any other value is left to the envelope's
    own check (returned as the text)."""
    if not isinstance(value, Mapping):
        return value, None
    unknown = set(value) - _CONTRACT_KEYS
    if unknown:
        raise EnvelopeError(
            "reply_contract",
            f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; expected text, must_return",
        )
    names = value.get("must_return")
    fields = None if names is None else must_return_fields(names, "reply_contract.must_return")
    return value.get("text"), fields


def contract_attributes(
    policy: EvidencePolicy | None, must_return: tuple[str, ...]
) -> dict[str, Any]:
    """The `create` span's attributes of the checks the envelope declares: the evidence
    policy's, and `handoff.reply_contract.must_return` when it names a field."""
    a = policy.attributes() if policy is not None else {}
    if must_return:
        a[sc.REPLY_CONTRACT_MUST_RETURN] = must_return
    return a
