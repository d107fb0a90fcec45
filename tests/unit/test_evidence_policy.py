"""The evidence policy and the structured reply contract of the envelope: validation names the
field, the wire form round-trips (the structured `reply_contract` object included, the free
text kept), and the shim puts them on the `create` span and a result's fields on its span."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analytics.oracle import evidence as ev
from collector import Envelope, EnvelopeError, EvidencePolicy, HandoffTracer, InMemoryRecorder
from collector import semconv as sc

BASE = {
    "task_id": "t1",
    "handoff_id": "h1",
    "from_agent": "planner",
    "to_agent": "coder",
    "mode": "delegate",
}
AFTER, BEFORE = "2026-12-01T10:00:00Z", "2026-12-02T10:00:00+00:00"


def env(**kw) -> Envelope:
    return Envelope(**{**BASE, **kw})


@pytest.mark.parametrize(
    ("policy", "field", "reason"),
    [
        ({"valid_after": "yesterday"}, "evidence_policy.valid_after", "not an ISO-8601 UTC time"),
        ({"valid_before": "2026-12-01T10:00:00+02:00"}, "evidence_policy.valid_before", "date, time and Z"),
        ({"valid_after": BEFORE, "valid_before": AFTER}, "evidence_policy.valid_before", "must be after valid_after"),
        ({"valid_after": AFTER, "valid_before": AFTER}, "evidence_policy.valid_before", "must be after valid_after"),
        ({"min_refs": -1}, "evidence_policy.min_refs", "must be an integer >= 0, got -1"),
        ({"min_refs": True}, "evidence_policy.min_refs", "must be an integer >= 0, got True"),
        ({"min_refs": "2"}, "evidence_policy.min_refs", "got '2'"),
        ({"require_claims": "yes"}, "evidence_policy.require_claims", "must be true or false"),
    ],
)  # fmt: skip
def test_a_bad_policy_names_its_field(policy, field, reason):
    with pytest.raises(EnvelopeError, match=re.escape(reason)) as e:
        env(evidence_policy=policy)
    assert (e.value.field, e.value.code) == (field, "invalid_envelope")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"evidence_policy": 3}, "evidence_policy"),
        ({"must_return": "answer"}, "must_return"),
        ({"must_return": ["answer", ""]}, "must_return"),
        ({"must_return": [1]}, "must_return"),
    ],
)
def test_a_bad_contract_names_its_field(kw, field):
    with pytest.raises(EnvelopeError) as e:
        env(**kw)
    assert e.value.field == field


def test_policy_and_must_return_round_trip_the_wire():
    e = env(
        evidence_policy={"valid_after": AFTER, "min_refs": 2, "require_claims": True, "x": 1},
        must_return=["answer", "sources"],
        reply_contract="an answer with its sources",
    )
    assert e.evidence_policy == EvidencePolicy(valid_after=AFTER, min_refs=2, require_claims=True)
    assert e.must_return == ("answer", "sources")
    wire = e.to_wire()
    assert wire["evidence_policy"] == {"valid_after": AFTER, "min_refs": 2, "require_claims": True}
    assert wire["must_return"] == ["answer", "sources"]
    assert wire["reply_contract"] == "an answer with its sources"
    assert Envelope.from_wire(wire) == e
    # nothing declared: nothing on the wire
    assert {"evidence_policy", "must_return"}.isdisjoint(env().to_wire())


def test_the_structured_reply_contract_object_is_read():
    e = Envelope.from_wire(
        {**BASE, "reply_contract": {"text": "answer + sources", "must_return": ["answer"]}}
    )
    assert (e.reply_contract, e.must_return) == ("answer + sources", ("answer",))
    same = Envelope.from_wire(
        {**BASE, "reply_contract": {"must_return": ["a"]}, "must_return": ["a"]}
    )
    assert (same.reply_contract, same.must_return) == (None, ("a",))
    with pytest.raises(EnvelopeError, match=r"differs from reply_contract\.must_return"):
        Envelope.from_wire({**BASE, "reply_contract": {"must_return": ["a"]}, "must_return": ["b"]})
    with pytest.raises(EnvelopeError, match="unknown key"):
        Envelope.from_wire({**BASE, "reply_contract": {"must": ["a"]}})
    with pytest.raises(EnvelopeError) as bad:
        Envelope.from_wire({**BASE, "reply_contract": {"must_return": "a"}})
    assert bad.value.field == "reply_contract.must_return"


def test_the_create_span_carries_the_checks_and_results_their_fields():
    rec = InMemoryRecorder()
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    coder = HandoffTracer("coder", tracer_provider=rec.provider)
    policy = EvidencePolicy(valid_after=AFTER, valid_before=BEFORE, min_refs=1)
    h = planner.create(env(evidence_policy=policy, must_return=("answer",), reply_contract="x"))
    r = coder.receive(h.to_wire())
    assert r.envelope.evidence_policy == policy and r.envelope.must_return == ("answer",)
    r.accept()
    r.start()
    r.prepare(evidence_count=1, evidence_valid=True, result_fields=["answer", "cost"])
    r.commit(result_fields=())
    create, *_, prepare, commit = rec.transitions()
    assert {k: v for k, v in create.items() if "evidence_policy" in k or "reply_contract" in k} == {
        sc.EVIDENCE_POLICY_VALID_AFTER: AFTER,
        sc.EVIDENCE_POLICY_VALID_BEFORE: BEFORE,
        sc.EVIDENCE_POLICY_MIN_REFS: 1,
        sc.EVIDENCE_POLICY_REQUIRE_CLAIMS: False,
        sc.REPLY_CONTRACT_MUST_RETURN: ("answer",),
        sc.REPLY_CONTRACT: "x",
    }
    assert prepare[sc.RESULT_FIELDS] == ("answer", "cost")
    assert commit[sc.RESULT_FIELDS] == ()
    with pytest.raises(ValueError, match="result_fields: expected a list of str"):
        r.verify(result_fields="answer")


def test_a_receiver_refuses_an_envelope_with_a_bad_policy():
    rec = InMemoryRecorder()
    coder = HandoffTracer("coder", tracer_provider=rec.provider)
    with pytest.raises(EnvelopeError, match=r"evidence_policy\.min_refs"):
        coder.receive({**BASE, "evidence_policy": {"min_refs": -2}})
    (reject,) = rec.transitions()
    assert (reject[sc.EVENT], reject[sc.ERROR_CODE]) == ("reject", "invalid_envelope")


DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-developers.md"


def test_the_agent_developers_example_runs_and_meets_its_own_checks():
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
        if "EvidencePolicy" in b
    ]
    rec = InMemoryRecorder()
    names = {
        "planner": HandoffTracer("planner", tracer_provider=rec.provider),
        "coder": HandoffTracer("coder", tracer_provider=rec.provider),
    }
    exec(compile(block, str(DOC), "exec"), names)
    rows = [
        {
            "handoff_id": t[sc.HANDOFF_ID], "event": t[sc.EVENT], "from_state": t[sc.FROM_STATE],
            "to_state": t[sc.TO_STATE], "time_ns": 0, "evidence_count": t.get(sc.EVIDENCE_COUNT),
            "evidence_valid": t.get(sc.EVIDENCE_VALID),
            "attributes": {k: json.dumps(list(v)) if isinstance(v, tuple) else
                           str(v).lower() if isinstance(v, bool) else str(v) for k, v in t.items()},
        }
        for t in rec.transitions()
    ]  # fmt: skip
    assert [r["event"] for r in rows] == ["create", "accept", "start", "commit"]
    assert rows[-1]["attributes"][sc.RESULT_FIELDS] == '["patch", "tests"]'
    assert ev.policy(rows).min_refs == 2 and ev.kinds(rows) == []
    rec.shutdown()
