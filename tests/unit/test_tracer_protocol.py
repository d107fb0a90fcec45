"""The protocol-audit attributes on real SDK spans: grant and evidence on create, receipt
layers on commit / verify, error codes, and the receiver's reject of a refused envelope."""

from __future__ import annotations

import pytest

from collector import (
    Envelope,
    EnvelopeError,
    EvidenceRef,
    HandoffTracer,
    InMemoryRecorder,
    semconv,
)
from collector.envelope import Grant

T0 = 1_764_590_400_000_000_000


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


def envelope(**kw) -> Envelope:
    base = dict(task_id="t1", handoff_id="h1", from_agent="planner", to_agent="coder",
                mode="delegate")  # fmt: skip
    return Envelope(**{**base, **kw})


def test_grant_and_evidence_claims_reach_the_create_span_typed(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    grant = Grant(
        caller="planner",
        subject="ops@example.com",
        tenant="acme",
        capabilities=("repo.write",),
        resources=("repo:acme/api", "ci:acme"),
        expires_at="2026-12-01T12:00:00Z",
        approval="chg-981",
    )
    refs = (
        EvidenceRef("doc:1", "spec says so", "2026-11-30T09:00:00Z"),
        EvidenceRef("test:2"),
        EvidenceRef("log:3", valid_at="2026-11-30T10:00:00Z"),
    )
    tracer.create(envelope(grant=grant, evidence_refs=refs))
    (c,) = rec.transitions()
    assert c[semconv.GRANT_CALLER] == "planner" and c[semconv.GRANT_TENANT] == "acme"
    assert c[semconv.GRANT_SUBJECT] == "[REDACTED]"  # the input filter: name people by an id
    assert c[semconv.GRANT_CAPABILITIES] == ("repo.write",)
    assert c[semconv.GRANT_RESOURCES] == ("repo:acme/api", "ci:acme")
    assert c[semconv.GRANT_EXPIRES_AT] == "2026-12-01T12:00:00Z"
    assert c[semconv.GRANT_APPROVAL] == "chg-981"
    assert c[semconv.EVIDENCE_REFS] == ("doc:1", "test:2", "log:3")
    assert c[semconv.EVIDENCE_CLAIMS] == ("spec says so", "", "")  # aligned with the ids
    assert c[semconv.EVIDENCE_VALID_AT] == ("2026-11-30T09:00:00Z", "", "2026-11-30T10:00:00Z")
    assert c[semconv.ATTEMPT] == 1


def test_bare_evidence_ids_carry_no_claim_arrays(rec):
    tracer = HandoffTracer("planner", tracer_provider=rec.provider)
    h = tracer.create(envelope(evidence_refs=["doc:1"]))
    h.accept()
    h.start()
    h.prepare(evidence_refs=["a", "b"])
    create, *_, prepare = rec.transitions()
    for t in (create, prepare):
        assert semconv.EVIDENCE_CLAIMS not in t and semconv.EVIDENCE_VALID_AT not in t
    assert semconv.GRANT_CALLER not in create


def test_receipt_layers_and_read_back_on_commit_and_verify(rec):
    tracer = HandoffTracer("coder", tracer_provider=rec.provider)
    h = tracer.create(envelope())
    h.accept()
    h.start()
    h.commit(
        receipt_id="rcpt-1",
        receipt_expires_at="2026-12-02T00:00:00Z",
        receipt_status="ok",
        evidence_refs=[EvidenceRef("doc:1", "built", "2026-12-01T10:00:00Z"), "test:2"],
    )
    h.verify(read_back=True, conflicts=[])
    h2 = tracer.create(envelope(handoff_id="h2"))
    h2.accept()
    h2.start()
    h2.commit(receipt_id="rcpt-2")
    h2.verify_fail(read_back=True, conflicts=["result_version", "receipt.hash"])
    by = {(t[semconv.HANDOFF_ID], t[semconv.EVENT]): t for t in rec.transitions()}
    commit = by[("h1", "commit")]
    assert commit[semconv.RECEIPT_ID] == "rcpt-1"
    assert commit[semconv.RECEIPT_EXPIRES_AT] == "2026-12-02T00:00:00Z"
    assert commit[semconv.EVIDENCE_REFS] == ("doc:1", "test:2")
    assert commit[semconv.EVIDENCE_CLAIMS] == ("built", "")
    assert commit[semconv.EVIDENCE_VALID_AT] == ("2026-12-01T10:00:00Z", "")
    verify = by[("h1", "verify")]
    assert verify[semconv.RECEIPT_READ_BACK] is True and verify[semconv.RECEIPT_CONFLICTS] == ()
    failed = by[("h2", "verify_fail")]
    assert failed[semconv.TO_STATE] == "unknown"
    assert failed[semconv.RECEIPT_CONFLICTS] == ("result_version", "receipt.hash")


@pytest.mark.parametrize("event", ["reject", "fail", "timeout"])
def test_error_codes_are_kept_as_sent_in_or_out_of_the_vocabulary(rec, event):
    tracer = HandoffTracer("coder", tracer_provider=rec.provider)
    for n, code in enumerate(["capability_not_granted", "vendor_quota_x"]):
        h = tracer.create(envelope(handoff_id=f"h{n}"))
        if event == "fail":
            h.accept()
            h.start()
        h.transition(event, error_code=code)
    codes = [t.get(semconv.ERROR_CODE) for t in rec.transitions() if t[semconv.EVENT] == event]
    assert codes == ["capability_not_granted", "vendor_quota_x"]
    assert "capability_not_granted" in semconv.ERROR_CODES


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"receipt_id": 1}, "receipt_id: expected str, got int 1"),
        ({"receipt_expires_at": "2026-12-02"}, "receipt_expires_at: not an ISO-8601 UTC time"),
        ({"receipt_expires_at": 5}, "receipt_expires_at: not an ISO-8601 UTC time"),
        ({"read_back": "yes"}, "read_back: expected bool, got str 'yes'"),
        ({"read_back": 1}, "read_back: expected bool, got int 1"),
        ({"conflicts": "hash"}, "conflicts: expected a list of str, got str 'hash'"),
        ({"conflicts": ["hash", 2]}, "conflicts: expected a list of str, got int 2"),
        ({"error_code": 404}, "error_code: expected str, got int 404"),
    ],
)
def test_bad_receipt_attributes_are_refused_by_name(rec, kw, message):
    h = HandoffTracer("coder", tracer_provider=rec.provider).create(envelope())
    with pytest.raises(ValueError) as ei:
        h.accept(**kw)
    assert message in str(ei.value)
    assert h.state == "created"


def _wire(tracer: HandoffTracer, **changes) -> dict:
    return {**tracer.create(envelope()).to_wire(), **changes}


@pytest.mark.parametrize(
    ("changes", "drop", "code"),
    [
        ({"protocol": "aa-handoff/v2"}, None, "incompatible_protocol"),
        ({}, "from_agent", "missing_required_field"),
        ({"mode": "fork"}, None, "invalid_envelope"),
        ({"grant": {"expires_at": "soon"}}, None, "invalid_envelope"),
        ({"traceparent": "00-zz"}, None, "invalid_envelope"),
    ],
)
def test_receive_of_a_refused_envelope_emits_the_receivers_reject(rec, changes, drop, code):
    sender = HandoffTracer("planner", tracer_provider=rec.provider)
    receiver = HandoffTracer("coder", tracer_provider=rec.provider)
    wire = _wire(sender, **changes)
    if drop:
        del wire[drop]
    with pytest.raises(EnvelopeError) as ei:
        receiver.receive(wire, at=T0)
    assert ei.value.code == code
    _create, reject = rec.transitions()
    assert reject[semconv.EVENT] == "reject" and reject[semconv.ACTOR] == "coder"
    assert (reject[semconv.FROM_STATE], reject[semconv.TO_STATE]) == ("created", "rejected")
    assert (reject[semconv.TASK_ID], reject[semconv.HANDOFF_ID]) == ("t1", "h1")
    assert reject[semconv.ERROR_CODE] == code and semconv.VALID not in reject
    c_span, r_span = rec.spans()
    assert r_span.start_time == T0
    if code != "invalid_envelope" or "traceparent" not in changes:  # joins the sender's trace
        assert r_span.context.trace_id == c_span.context.trace_id
        assert r_span.parent.span_id == c_span.context.span_id


@pytest.mark.parametrize(
    "wire",
    [
        {"task_id": "t1", "protocol": "aa-handoff/v2"},  # no handoff_id
        {"task_id": "", "handoff_id": "h1", "protocol": "aa-handoff/v2"},
        {"task_id": 5, "handoff_id": "h1", "protocol": "aa-handoff/v2"},
        ["not", "a", "dict"],
    ],
)
def test_a_refusal_nobody_can_attribute_emits_nothing(rec, wire):
    with pytest.raises(EnvelopeError):
        HandoffTracer("coder", tracer_provider=rec.provider).receive(wire)  # type: ignore[arg-type]
    assert rec.transitions() == []


def test_a_refused_envelope_mid_flight_is_flagged_when_lenient_and_skipped_when_strict(rec):
    sender = HandoffTracer("planner", tracer_provider=rec.provider)
    wire = _wire(sender, state="running", protocol="aa-handoff/v2")
    with pytest.raises(EnvelopeError):
        HandoffTracer("coder", tracer_provider=rec.provider).receive(wire)
    assert [t[semconv.EVENT] for t in rec.transitions()] == ["create"]
    with pytest.raises(EnvelopeError):
        HandoffTracer("coder", tracer_provider=rec.provider, strict=False).receive(wire)
    reject = rec.transitions()[-1]
    assert reject[semconv.EVENT] == "reject" and reject[semconv.VALID] is False
    assert reject[semconv.ERROR_CODE] == "incompatible_protocol"
    assert "not allowed from state 'running'" in reject[semconv.INVALID_REASON]


def test_an_accepted_envelope_emits_nothing_on_receive(rec):
    sender = HandoffTracer("planner", tracer_provider=rec.provider)
    wire = _wire(sender, grant={"caller": "planner"}, attempt=1)
    h = HandoffTracer("coder", tracer_provider=rec.provider).receive(wire)
    assert h.envelope.grant == Grant(caller="planner")
    assert [t[semconv.EVENT] for t in rec.transitions()] == ["create"]


def test_a_reject_inside_the_receivers_request_span_joins_the_sender_and_links_it(rec):
    sender = HandoffTracer("planner", tracer_provider=rec.provider)
    receiver = HandoffTracer("coder", tracer_provider=rec.provider)
    wire = _wire(sender, protocol="aa-handoff/v2")
    request_tracer = rec.provider.get_tracer("coder-http")
    with (
        request_tracer.start_as_current_span("POST /tasks") as request,
        pytest.raises(EnvelopeError),
    ):
        receiver.receive(wire)
    create, reject, _request = rec.spans()
    assert reject.context.trace_id == create.context.trace_id
    assert [link.context.span_id for link in reject.links] == [request.get_span_context().span_id]
