"""The aa-handoff/v1 envelope: validation errors name the field, wire round trips, forward compat."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector import Envelope, EnvelopeError, EvidenceRef

BASE = {
    "task_id": "t1",
    "handoff_id": "h1",
    "from_agent": "planner",
    "to_agent": "coder",
    "mode": "delegate",
}


def env(**kw) -> Envelope:
    return Envelope(**{**BASE, **kw})


def test_valid_envelope_normalizes_lists_to_tuples():
    e = env(
        capabilities=["code.write"], evidence_refs=["doc:1", {"id": "test:2", "claim": "passes"}]
    )
    assert e.capabilities == ("code.write",)
    assert e.evidence_refs == (EvidenceRef("doc:1"), EvidenceRef("test:2", "passes"))
    assert e.protocol == "aa-handoff/v1"
    assert e.topology == "in_process"
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.mode = "consult"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kw", "field", "reason"),
    [
        ({"handoff_id": ""}, "handoff_id", "must be a non-empty string"),
        ({"handoff_id": None}, "handoff_id", "required field missing"),
        ({"task_id": 7}, "task_id", "must be a string, got int"),
        ({"mode": "delegat"}, "mode", "unknown mode 'delegat'; expected one of delegate, consult"),
        ({"deadline_ms": -5}, "deadline_ms", "must be positive, got -5"),
        ({"deadline_ms": 0}, "deadline_ms", "must be positive, got 0"),
        ({"deadline_ms": True}, "deadline_ms", "must be an integer, got bool"),
        ({"deadline_ms": 1.5}, "deadline_ms", "must be an integer, got float"),
        ({"max_tool_calls": -1}, "max_tool_calls", "must be >= 0, got -1"),
        ({"fence_token": "3"}, "fence_token", "must be an integer, got str"),
        ({"capabilities": "code.write"}, "capabilities", "must be a list of strings, got str"),
        (
            {"capabilities": ["ok", 3]},
            "capabilities",
            "every capability must be a non-empty string, got 3",
        ),
        ({"evidence_refs": "doc:1"}, "evidence_refs", "must be a list, got str"),
        (
            {"evidence_refs": [3]},
            "evidence_refs[0]",
            "evidence item must be an id string or an object, got int",
        ),
        ({"evidence_refs": [{"claim": "x"}]}, "evidence_refs[0]", "evidence item has no 'id'"),
        ({"topology": "carrier_pigeon"}, "topology", "unknown topology 'carrier_pigeon'"),
        ({"protocol": "aa-handoff/v2"}, "protocol", "unsupported major version 'aa-handoff/v2'"),
        ({"protocol": "http/1.1"}, "protocol", "unknown protocol 'http/1.1'"),
        ({"protocol": "aa-handoff/v1\n"}, "protocol", "unknown protocol 'aa-handoff/v1\\n'"),
        ({"protocol": "aa-handoff/v١"}, "protocol", "unknown protocol"),
        ({"constraints": ["a"]}, "constraints", "must be an object (dict), got list"),
        ({"constraints": {1: "a"}}, "constraints", "keys must be strings, got 1"),
        ({"objective": b"bytes"}, "objective", "must be a string, got bytes"),
        ({"extra": {"mode": "consult"}}, "extra", "holds known field(s) mode"),
        (
            {"constraints": {"when": object()}},
            "constraints",
            "must be JSON-serializable: Object of type object",
        ),
        (
            {"constraints": {"x": float("nan")}},
            "constraints",
            "must be JSON-serializable: Out of range float",
        ),
        ({"extra": {"later": {1, 2}}}, "extra", "must be JSON-serializable: Object of type set"),
    ],
)
def test_bad_envelope_names_field_and_reason(kw, field, reason):
    with pytest.raises(EnvelopeError) as ei:
        env(**kw)
    assert ei.value.field == field
    assert reason in ei.value.reason
    assert str(ei.value).startswith(f"envelope field {field!r}: ")


def test_wire_round_trip_through_json():
    e = env(
        capabilities=("code.write", "repo.read"),
        evidence_refs=(EvidenceRef("doc:1", "spec says so", "2026-11-30T09:00:00Z"),),
        deadline_ms=60_000,
        idempotency_key="k1",
        topology="agent_as_tool",
        objective="fix bug 12",
        constraints={"lang": "python", "limits": {"files": 3}},
        contract_version="1.2",
        max_tool_calls=20,
        fence_token=4,
        state_version=9,
        payload_hash="sha256:ab",
        causation_id="h0",
        reply_contract="patch + test",
        parent_state="planning",
    )
    wire = json.loads(json.dumps(e.to_wire()))
    assert Envelope.from_wire(wire) == e


def test_to_wire_omits_unset_fields():
    assert env().to_wire() == {**BASE, "protocol": "aa-handoff/v1", "topology": "in_process"}


def test_forward_compat_unknown_optional_fields_kept_and_reemitted():
    wire = {**BASE, "protocol": "aa-handoff/v1.4", "priority": "high", "budget": {"usd": 3}}
    e = Envelope.from_wire(wire)
    assert e.protocol == "aa-handoff/v1.4"
    assert e.extra == {"priority": "high", "budget": {"usd": 3}}
    assert e.to_wire()["priority"] == "high"
    assert Envelope.from_wire(e.to_wire()) == e


def test_transport_keys_are_not_envelope_fields():
    e = Envelope.from_wire(
        {**BASE, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "state": "running"}
    )
    assert e.extra == {}


@pytest.mark.parametrize("missing", ["task_id", "handoff_id", "from_agent", "to_agent", "mode"])
def test_from_wire_missing_required_field(missing):
    wire = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(EnvelopeError, match=rf"envelope field '{missing}': required field missing"):
        Envelope.from_wire(wire)


def test_from_wire_refuses_unknown_major_before_reading_fields():
    # A v2 envelope may lay its fields out differently: refuse on the version, not on a field.
    with pytest.raises(EnvelopeError) as ei:
        Envelope.from_wire({"protocol": "aa-handoff/v2", "task": {"id": "t1"}})
    assert ei.value.field == "protocol"
    assert "unsupported major version 'aa-handoff/v2'; this shim speaks aa-handoff/v1" in str(
        ei.value
    )


def test_from_wire_refuses_non_mapping_and_non_list():
    with pytest.raises(EnvelopeError, match="envelope field 'envelope': must be an object"):
        Envelope.from_wire(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(
        EnvelopeError, match="envelope field 'capabilities': must be a list, got str"
    ):
        Envelope.from_wire({**BASE, "capabilities": "code.write"})


_text = st.text(min_size=1, max_size=12).filter(str.strip)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    ids=st.tuples(_text, _text, _text, _text),
    mode=st.sampled_from(["delegate", "consult", "transfer", "escalate"]),
    topology=st.sampled_from(["in_process", "agent_as_tool", "shared_queue", "federated_a2a"]),
    caps=st.lists(_text, max_size=4),
    deadline=st.none() | st.integers(1, 10**9),
    objective=st.none() | st.text(max_size=50),
    extra=st.dictionaries(
        st.sampled_from(["x_new", "y_later", "hint"]), st.integers() | st.text(max_size=5)
    ),
)
def test_round_trip_property(ids, mode, topology, caps, deadline, objective, extra):
    e = Envelope(
        task_id=ids[0],
        handoff_id=ids[1],
        from_agent=ids[2],
        to_agent=ids[3],
        mode=mode,
        topology=topology,
        capabilities=tuple(caps),
        deadline_ms=deadline,
        objective=objective,
        extra=extra,
    )
    assert Envelope.from_wire(json.loads(json.dumps(e.to_wire()))) == e


def test_envelope_is_hashable_and_decoupled_from_caller_dicts():
    constraints = {"lang": "python"}
    e = env(constraints=constraints, extra={"hint": 1})
    constraints["lang"] = "rust"
    assert e.constraints == {"lang": "python"}
    assert hash(e) == hash(env(constraints={"other": 1}))  # dict fields do not take part in hash
    assert len({e, env(constraints={"lang": "python"}, extra={"hint": 1})}) == 1
