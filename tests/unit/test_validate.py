"""Wire-contract validation: bad shape rejects the span; an illegal transition is kept, flagged."""

from __future__ import annotations

import pytest

from collector import contract, semconv
from ingest import TENANT_MISMATCH, decode_protobuf
from ingest.testing import request_protobuf, span_json, transition

T0 = 1_780_000_000_000_000_000


def _decode(attrs_list, tenant="acme"):
    spans = [
        span_json(trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", attributes=a, start_ns=T0 + i)
        for i, a in enumerate(attrs_list)
    ]
    return decode_protobuf(request_protobuf(spans), tenant=tenant)


@pytest.mark.parametrize(
    ("name", "value", "want"),
    [
        ("handoff.deadline_ms", "30s", "handoff.deadline_ms must be int, got string"),
        ("handoff.evidence.valid", "yes", "handoff.evidence.valid must be bool, got string"),
        ("handoff.capabilities", "search", "handoff.capabilities must be string[], got string"),
        ("handoff.capabilities", ["a", 2], "non-string items"),
        (
            "handoff.consumer.supported_versions",
            "1",
            "handoff.consumer.supported_versions must be int[], got string",
        ),
        (
            "handoff.consumer.supported_versions",
            [1, "2"],
            "must be int[], got an array with non-int",
        ),
        ("handoff.actor", 7, "handoff.actor must be string, got int"),
        ("handoff.evidence.count", 1.5, "handoff.evidence.count must be int, got double"),
    ],
)
def test_wrong_types_reject_the_span_with_the_reason(name, value, want):
    good = transition("h-1", "create", "", "created")
    bad = transition("h-1", "accept", "created", "accepted")
    bad[name] = value
    b = _decode([good, bad])
    assert (b.spans, b.stored, len(b.rejects)) == (2, 1, 1)
    assert want in b.rejects[0].reason
    assert b.rejects[0].span_id == f"{2:016x}"
    assert want in b.error_message()


def test_missing_required_attributes_are_named():
    attrs = transition("h-1", "create", "", "created")
    del attrs[semconv.ACTOR]
    del attrs[semconv.MODE]
    b = _decode([attrs])
    assert b.stored == 0
    assert b.rejects[0].reason == "missing required attribute(s): handoff.actor, handoff.mode"


def test_every_transition_in_the_table_is_valid():
    rows = [
        transition("h", e.value, s.value, t.value) for (s, e), t in contract.TRANSITIONS.items()
    ]
    rows.append(transition("h", "create", "", "created"))
    b = _decode(rows)
    assert b.stored == len(rows) and not b.rejects and b.flagged == 0
    assert all(semconv.VALID not in a for a in b.columns["SpanAttributes"])


@pytest.mark.parametrize(
    ("frm", "event", "to", "why"),
    [
        ("created", "commit", "committed", "not allowed from state 'created'"),
        ("running", "commit", "failed", "leads to 'committed', not 'failed'"),
        ("verified", "cancel", "canceled", "terminal state"),
        ("created", "teleport", "running", "unknown event 'teleport'"),
        ("", "accept", "accepted", "before create"),
    ],
)
def test_illegal_transition_is_stored_and_flagged(frm, event, to, why):
    b = _decode([transition("h-1", event, frm, to)])
    assert (b.stored, len(b.rejects), b.flagged) == (1, 0, 1)
    attrs = b.columns["SpanAttributes"][0]
    assert attrs[semconv.VALID] == "false"
    assert why in attrs[semconv.INVALID_REASON]
    assert len(b.ledger) == 1  # still a transition with a ledger row


def test_shim_supplied_invalid_reason_is_kept():
    attrs = transition("h-1", "commit", "created", "committed")
    attrs[semconv.VALID] = False
    attrs[semconv.INVALID_REASON] = "lenient shim: commit before accept"
    b = _decode([attrs])
    assert (
        b.columns["SpanAttributes"][0][semconv.INVALID_REASON]
        == "lenient shim: commit before accept"
    )


def test_tenant_claim_differing_from_credential_is_flagged():
    other = transition("h-1", "create", "", "created")
    other[semconv.TENANT] = "globex"
    same = transition("h-2", "create", "", "created")
    same[semconv.TENANT] = "acme"
    b = _decode([other, same], tenant="acme")
    a0, a1 = b.columns["SpanAttributes"]
    assert a0[TENANT_MISMATCH] == "true" and a0[semconv.TENANT] == "globex"
    assert TENANT_MISMATCH not in a1


def test_non_handoff_spans_pass_untouched():
    b = _decode([{"db.system": "clickhouse", "handoff.tenant": "x"}])
    assert (
        b.stored == 1
        and not b.ledger
        and b.columns["SpanAttributes"][0]
        == {
            "db.system": "clickhouse",
            "handoff.tenant": "x",
        }
    )
