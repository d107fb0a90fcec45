"""Envelope fields of the protocol audit: grant, attempt / retry_of, evidence valid_at.
Plain values in, a validated envelope (or an EnvelopeError naming the field) out."""

from __future__ import annotations

from typing import Any

import pytest

from collector import Envelope, EnvelopeError, EvidenceRef
from collector.envelope import Grant, utc_time_problem

BASE: dict[str, Any] = dict(
    task_id="t1", handoff_id="h2", from_agent="planner", to_agent="coder", mode="delegate"
)
GRANT = {
    "caller": "planner",
    "subject": "user:42",
    "tenant": "acme",
    "capabilities": ["repo.write"],
    "resources": ["repo:acme/api"],
    "expires_at": "2026-12-01T12:00:00Z",
    "approval": "chg-981",
}


def test_grant_attempt_and_retry_of_round_trip_the_wire():
    env = Envelope(**BASE, grant=GRANT, attempt=2, retry_of="h1")  # type: ignore[arg-type]  # the wire dict, coerced to a Grant
    assert env.grant == Grant(
        caller="planner",
        subject="user:42",
        tenant="acme",
        capabilities=("repo.write",),
        resources=("repo:acme/api",),
        expires_at="2026-12-01T12:00:00Z",
        approval="chg-981",
    )
    wire = env.to_wire()
    assert wire["grant"] == GRANT and (wire["attempt"], wire["retry_of"]) == (2, "h1")
    assert Envelope.from_wire(wire) == env


def test_unknown_keys_of_a_grant_are_dropped_on_read():
    env = Envelope.from_wire({**BASE, "grant": {**GRANT, "scope_v2": "x"}})
    assert env.grant is not None and "scope_v2" not in env.grant.to_wire()
    assert env.extra == {}


@pytest.mark.parametrize(
    ("kw", "field", "words"),
    [
        ({"grant": {"expires_at": "tomorrow"}}, "grant.expires_at", "not an ISO-8601 UTC time"),
        (
            {"grant": {"expires_at": "2026-12-01T12:00:00+02:00"}},
            "grant.expires_at",
            "not an ISO-8601 UTC time",
        ),
        ({"grant": {"expires_at": "2026-12-01"}}, "grant.expires_at", "not an ISO-8601 UTC time"),
        ({"grant": {"expires_at": 1764590400}}, "grant.expires_at", "must be a string"),
        ({"grant": {"caller": ""}}, "grant.caller", "non-empty"),
        ({"grant": {"subject": 42}}, "grant.subject", "must be a string"),
        ({"grant": {"tenant": "  "}}, "grant.tenant", "non-empty"),
        ({"grant": {"approval": ["a"]}}, "grant.approval", "must be a string"),
        ({"grant": {"resources": "repo:x"}}, "grant.resources", "list of strings"),
        ({"grant": {"capabilities": ["ok", ""]}}, "grant.capabilities", "non-empty string"),
        ({"grant": "all"}, "grant", "must be an object"),
        ({"attempt": 0}, "attempt", "must be positive"),
        ({"attempt": "2"}, "attempt", "must be an integer"),
        ({"attempt": True}, "attempt", "must be an integer"),
        ({"retry_of": "h1", "attempt": 1}, "attempt", "attempt 2 or later"),
        ({"retry_of": "h2"}, "retry_of", "names this handoff itself"),
        ({"retry_of": ""}, "retry_of", "non-empty"),
        ({"retry_of": 7}, "retry_of", "must be a string"),
        (
            {"evidence_refs": ["doc:0", {"id": "doc:1", "valid_at": "yesterday"}]},
            "evidence_refs[1].valid_at",
            "not an ISO-8601 UTC time",
        ),
        (
            {"evidence_refs": [{"id": "doc:1", "claim": 3}]},
            "evidence_refs[0].claim",
            "must be a string",
        ),
    ],
)
def test_each_bad_field_is_refused_by_name(kw, field, words):
    with pytest.raises(EnvelopeError) as ei:
        Envelope(**BASE, **kw)
    assert ei.value.field == field
    assert f"'{field}'" in str(ei.value) and words in str(ei.value)
    assert ei.value.code == "invalid_envelope"
    with pytest.raises(EnvelopeError) as from_wire:  # the same refusal read from the wire
        Envelope.from_wire({**BASE, **kw})
    assert from_wire.value.field == field


@pytest.mark.parametrize(
    ("wire", "field", "code"),
    [
        ({**BASE, "protocol": "aa-handoff/v2"}, "protocol", "incompatible_protocol"),
        ({**BASE, "protocol": "mcp/v1"}, "protocol", "incompatible_protocol"),
        ({k: v for k, v in BASE.items() if k != "to_agent"}, "to_agent", "missing_required_field"),
        ({**BASE, "mode": "fork"}, "mode", "invalid_envelope"),
        ({**BASE, "grant": {"expires_at": "soon"}}, "grant.expires_at", "invalid_envelope"),
    ],
)
def test_an_envelope_error_carries_the_refusal_code(wire, field, code):
    with pytest.raises(EnvelopeError) as ei:
        Envelope.from_wire(wire)
    assert (ei.value.field, ei.value.code) == (field, code)


@pytest.mark.parametrize(
    "value", ["2026-12-01T12:00:00Z", "2026-12-01T12:00:00.123456Z", "2026-12-01T12:00:00+00:00"]
)
def test_utc_times_accepted(value):
    assert utc_time_problem(value) is None
    assert EvidenceRef("doc:1", "ok", value).valid_at == value  # kept as given


@pytest.mark.parametrize(
    "value", ["2026-12-01T12:00:00", "2026-12-01T13:00:00+01:00", "2026-12-01", "", "now", None]
)
def test_times_without_utc_refused(value):
    assert utc_time_problem(value) is not None
