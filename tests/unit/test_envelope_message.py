"""The envelope's message fields (message_id, ttl_s, requires_ack, payload_ref): validated
by name, carried on the wire both ways, and on the create span as `handoff.message.*`."""

from __future__ import annotations

import json

import pytest

from collector import Envelope, EnvelopeError, HandoffTracer, InMemoryRecorder, semconv


def env(**kw: object) -> Envelope:
    base: dict = {"task_id": "t1", "handoff_id": "h1", "from_agent": "planner",
                  "to_agent": "coder", "mode": "delegate"}  # fmt: skip
    return Envelope(**{**base, **kw})


def test_the_fields_round_trip_through_the_wire():
    e = env(message_id="msg-7", ttl_s=30, requires_ack=True, payload_ref="s3://bucket/p/7")
    wire = json.loads(json.dumps(e.to_wire()))
    assert {k: wire[k] for k in ("message_id", "ttl_s", "requires_ack", "payload_ref")} == {
        "message_id": "msg-7",
        "ttl_s": 30,
        "requires_ack": True,
        "payload_ref": "s3://bucket/p/7",
    }
    assert Envelope.from_wire(wire) == e
    plain = env()
    assert not {"message_id", "ttl_s", "requires_ack", "payload_ref"} & set(plain.to_wire())


@pytest.mark.parametrize(
    ("kw", "field", "reason"),
    [
        ({"ttl_s": 0}, "ttl_s", "must be positive (seconds), got 0"),
        ({"ttl_s": -5}, "ttl_s", "must be positive (seconds), got -5"),
        ({"ttl_s": 1.5}, "ttl_s", "must be an integer (seconds), got float"),
        ({"ttl_s": True}, "ttl_s", "must be an integer (seconds), got bool"),
        ({"ttl_s": "30"}, "ttl_s", "must be an integer (seconds), got str"),
        ({"requires_ack": "yes", "ttl_s": 5}, "requires_ack", "must be a bool, got str 'yes'"),
        ({"requires_ack": 1, "ttl_s": 5}, "requires_ack", "must be a bool, got int 1"),
        ({"requires_ack": True}, "requires_ack", "needs ttl_s"),
        ({"message_id": ""}, "message_id", "must be a non-empty string when given, got ''"),
        ({"message_id": "  "}, "message_id", "must be a non-empty string"),
        ({"message_id": 7}, "message_id", "must be a non-empty string when given, got 7"),
        ({"payload_ref": ""}, "payload_ref", "must be a non-empty string when given"),
        ({"payload_ref": "x" * 5000}, "payload_ref", "longer than 4096 characters"),
    ],
)
def test_a_bad_field_is_refused_by_name(kw, field, reason):
    with pytest.raises(EnvelopeError) as ei:
        env(**kw)
    assert ei.value.field == field and reason in ei.value.reason
    assert ei.value.code == "invalid_envelope"
    # and the same from the wire
    wire = {**env().to_wire(), **kw}
    with pytest.raises(EnvelopeError) as ei:
        Envelope.from_wire(wire)
    assert ei.value.field == field


def test_an_ack_without_a_ttl_is_allowed_when_not_required():
    assert env(requires_ack=False).requires_ack is False
    assert env(ttl_s=1, requires_ack=True).ttl_s == 1


def test_the_create_span_carries_them_and_the_payload_ref_is_filtered():
    rec = InMemoryRecorder()
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    ref = "https://blob.example/p?sig=1&api_key=sk-live-abcdef0123456789abcdef"
    tracer.create(env(message_id="msg-7", ttl_s=30, requires_ack=False, payload_ref=ref))
    (create,) = rec.transitions()
    assert create[semconv.MESSAGE_ID] == "msg-7"
    assert create[semconv.MESSAGE_TTL_S] == 30
    assert create[semconv.MESSAGE_REQUIRES_ACK] is False  # an explicit false is kept
    assert create[semconv.MESSAGE_PAYLOAD_REF].startswith("https://blob.example/p?")
    assert "sk-live-abcdef0123456789abcdef" not in create[semconv.MESSAGE_PAYLOAD_REF]
    tracer.create(env(handoff_id="h2"))
    assert not any(k.startswith("handoff.message.") for k in rec.transitions()[-1])


def test_a_receiver_refuses_a_bad_message_field_with_a_reject():
    rec = InMemoryRecorder()
    wire = {**env().to_wire(), "requires_ack": True, "state": "created"}
    with pytest.raises(EnvelopeError, match="requires_ack"):
        HandoffTracer("coder", tracer_provider=rec.provider).receive(wire)
    (reject,) = rec.transitions()
    assert (reject[semconv.EVENT], reject[semconv.ERROR_CODE]) == ("reject", "invalid_envelope")
