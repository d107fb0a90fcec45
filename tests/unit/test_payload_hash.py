"""handoff.payload_hash: the pure digest (known answers computed outside Python with
`printf '%s' '<canonical json>' | sha256sum`) and what the shim puts on the create span."""

from __future__ import annotations

import json

from collector import (
    Envelope,
    EvidenceRef,
    HandoffTracer,
    InMemoryRecorder,
    envelope_payload_hash,
    payload_hash,
    semconv,
)

#: the canonical JSON of ENV's payload, written by hand: sorted keys, no white space, UTF-8
CANONICAL = (
    '{"capabilities":["payments.refund"],'
    '"constraints":{"amount":10,"currency":"EUR","note":"café"},'
    '"evidence_refs":[{"claim":"paid","id":"order:7"}],'
    '"objective":"refund 10 EUR","parent_state":null}'
)
CANONICAL_SHA256 = "5f2f73196e608c8f7bbad19f84b783c12dc2a56d0a604178049b74f0d73d9d81"
EMPTY_SHA256 = "da86d49240aac6de0f624878279d59c0ddbef96cda4cba12945b93be98a7a71e"


def _env(**kw: object) -> Envelope:
    fields: dict[str, object] = {
        "task_id": "t1",
        "handoff_id": "h1",
        "from_agent": "billing",
        "to_agent": "payments",
        "mode": "delegate",
        "idempotency_key": "refund-7",
        "objective": "refund 10 EUR",
        "constraints": {"note": "café", "currency": "EUR", "amount": 10},
        "capabilities": ("payments.refund",),
        "evidence_refs": (EvidenceRef("order:7", "paid"),),
        **kw,
    }
    return Envelope(**fields)  # type: ignore[arg-type]


def test_known_answer_of_a_fixed_payload():
    assert payload_hash(json.loads(CANONICAL)) == "sha256:" + CANONICAL_SHA256
    assert envelope_payload_hash(_env()) == "sha256:" + CANONICAL_SHA256


def test_an_envelope_without_payload_fields_hashes_the_empty_payload():
    bare = Envelope(task_id="t", handoff_id="h", from_agent="a", to_agent="b", mode="consult")
    assert envelope_payload_hash(bare) == "sha256:" + EMPTY_SHA256


def test_key_order_and_layout_do_not_change_it():
    spaced = json.loads(json.dumps(json.loads(CANONICAL), indent=4, ensure_ascii=True))
    reordered = dict(reversed(list(spaced.items())))
    assert payload_hash(reordered) == "sha256:" + CANONICAL_SHA256
    other_order = _env(constraints={"amount": 10, "currency": "EUR", "note": "café"})
    assert envelope_payload_hash(other_order) == "sha256:" + CANONICAL_SHA256


def test_routing_fields_are_not_hashed():
    moved = _env(handoff_id="h2", to_agent="payments-eu", idempotency_key="k9", attempt=3)
    assert envelope_payload_hash(moved) == "sha256:" + CANONICAL_SHA256


def test_a_changed_amount_changes_it():
    base = envelope_payload_hash(_env())
    assert envelope_payload_hash(_env(objective="refund 1,000 EUR")) != base
    amount = {"note": "café", "currency": "EUR", "amount": 1000}
    assert envelope_payload_hash(_env(constraints=amount)) != base
    assert envelope_payload_hash(_env(evidence_refs=(EvidenceRef("order:7", "unpaid"),))) != base
    assert envelope_payload_hash(_env(capabilities=("payments.refund", "x"))) != base
    assert envelope_payload_hash(_env(parent_state="checkout")) != base


def test_the_create_span_carries_it_and_a_given_hash_wins():
    rec = InMemoryRecorder()
    tracer = HandoffTracer("billing", tracer_provider=rec.provider)
    tracer.create(_env())
    tracer.create(_env(handoff_id="h2", payload_hash="caller:v1"))
    first, second = rec.transitions()
    assert first[semconv.PAYLOAD_HASH] == "sha256:" + CANONICAL_SHA256
    assert second[semconv.PAYLOAD_HASH] == "caller:v1"


def test_a_retry_hashes_its_own_envelope():
    rec = InMemoryRecorder()
    tracer = HandoffTracer("billing", tracer_provider=rec.provider)
    h1 = tracer.create(_env())
    h1.reject()
    same = h1.retry("h2")
    same.reject()
    h1.retry("h3", objective="refund 1,000 EUR")
    creates = [t for t in rec.transitions() if t[semconv.EVENT] == "create"]
    hashes = [t[semconv.PAYLOAD_HASH] for t in creates]
    assert hashes[0] == hashes[1] == "sha256:" + CANONICAL_SHA256
    assert hashes[2] == envelope_payload_hash(_env(objective="refund 1,000 EUR"))
