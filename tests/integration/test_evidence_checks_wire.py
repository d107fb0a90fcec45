"""Evidence checked, not declared: handoffs declaring an evidence policy and a reply contract
go through the shim (HandoffTracer on a real OTel SDK and OTLP/HTTP exporter) into a real
`handoffs serve`, and analytics reads the four evidence kinds and the checked funnel back
over serve's query port. Every number below is counted by hand from the fixture.

The policy: valid_after = A, valid_before = B (one hour before and two after the hour the
handoffs are created in), at least 2 refs, a claim on each; must_return = answer, sources.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import analytics
from collector import Envelope, EvidencePolicy, EvidenceRef, HandoffTracer

S = 10**9
HOUR = 3_600 * S
#: recent (the tables' TTL drops old months), a whole hour, three hours ago
T0 = (time.time_ns() // HOUR - 3) * HOUR
START = datetime.fromtimestamp(T0 / S, UTC)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


A, B = T0 - HOUR, T0 + 2 * HOUR
POLICY = EvidencePolicy(valid_after=_iso(A), valid_before=_iso(B), min_refs=2, require_claims=True)
MUST = ("answer", "sources")
KINDS = (
    "evidence_out_of_window",
    "evidence_below_policy",
    "reply_contract_unmet",
    "evidence_claim_disputed",
    "committed_without_evidence",
)


def _refs(*valid_at: int, claims: bool = True) -> list[EvidenceRef]:
    return [
        EvidenceRef(f"doc:{i}", "page cited" if claims or i == 0 else None, _iso(t))
        for i, t in enumerate(valid_at)
    ]


#: handoff -> (declares the policy and contract, refs, fields of prepare and of commit,
#: the emitter's evidence.valid, how it ends)
CASES = {
    # a ref exactly at valid_after, one a second before valid_before; the must_return
    # fields split over the two results: nothing to flag
    "edge": (True, _refs(A, B - S), ["answer"], ["sources"], True, "commit"),
    "early": (True, _refs(A - S, B - S), MUST, MUST, True, "commit"),
    "late": (True, _refs(A, B), MUST, MUST, True, "commit"),  # valid_before is exclusive
    "few": (True, _refs(A + S), MUST, MUST, True, "commit"),
    "unclaimed": (True, _refs(A, A, claims=False), MUST, MUST, True, "commit"),
    "unmet": (True, _refs(A, B - S), ["answer"], ["answer"], True, "commit"),
    # no policy, no must_return: the emitter's word counts (old refs without claims)
    "free": (
        False,
        [EvidenceRef("doc:0"), EvidenceRef("doc:1", None, _iso(A - HOUR))],
        None,
        None,
        True,
        "commit",
    ),
    # out of window, but the emitter did not claim it valid: not disputed
    "honest": (True, _refs(A - S, A), MUST, MUST, False, "commit"),
    # the contract unmet, but never committed: no reply_contract_unmet; the claim is disputed
    "failed": (True, _refs(A, A), ["answer"], None, True, "fail"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("evidence-checks"))
    try:
        tick = iter(range(T0, T0 + HOUR, S))
        provider = TracerProvider(resource=Resource.create({"service.name": "evidence-checks"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(f"{s.otlp_url}/v1/traces"))
        )
        planner = HandoffTracer("planner", tracer_provider=provider, clock=lambda: next(tick))
        worker = HandoffTracer("worker", tracer_provider=provider, clock=lambda: next(tick))
        for hid, (declares, refs, first, then, valid, end) in CASES.items():
            env = Envelope(
                task_id=f"task-{hid}", handoff_id=hid, from_agent="planner", to_agent="worker",
                mode="delegate", reply_contract="answer + sources",
                evidence_policy=POLICY if declares else None, must_return=MUST if declares else (),
            )  # fmt: skip
            h = worker.receive(planner.create(env).to_wire())
            h.accept()
            h.start()
            ev: dict[str, Any] = {
                "evidence_count": len(refs),
                "evidence_valid": valid,
                "evidence_refs": refs,
            }
            h.prepare(result_fields=first, **ev)
            if end == "commit":
                h.commit(result_fields=then, receipt_status="ok", **ev)
            else:
                h.fail(error_code="conflict")
        provider.force_flush()
        provider.shutdown()
        s.wait_stored()
        yield s
    finally:
        s.stop()


def _window() -> analytics.Window:
    return analytics.Window(
        start=START, end=START + timedelta(hours=1), as_of=START + timedelta(hours=2)
    )


def test_each_check_flags_its_handoffs_and_the_near_misses_none(served):
    with served.client() as c:
        df = analytics.anomalies(
            c, database=served.database, window=_window(), kinds=KINDS, examples=20
        )
    got = {r.kind: (r.count, sorted(r.examples)) for r in df.itertuples()}
    assert got == {
        "evidence_out_of_window": (3, ["early", "honest", "late"]),
        "evidence_below_policy": (2, ["few", "unclaimed"]),
        "reply_contract_unmet": (1, ["unmet"]),
        "evidence_claim_disputed": (6, ["early", "failed", "few", "late", "unclaimed", "unmet"]),
        # committed_without_evidence follows the checked V(h)
        "committed_without_evidence": (6, ["early", "few", "honest", "late", "unclaimed", "unmet"]),
    }


def test_p_evidence_counts_checked_results_beside_the_emitters_claim(served):
    with served.client() as c:
        row = analytics.funnel(c, database=served.database, window=_window()).iloc[0]
        behind = analytics.handoffs_behind(
            c, database=served.database, window=_window(), stage="evidence_disputed"
        )
    assert (row.settled, row.executed, row.evidence_claimed, row.evidenced, row.committed) == (
        9, 9, 8, 2, 2,
    )  # fmt: skip
    assert row.p_evidence == pytest.approx(2 / 9)
    assert row.p_evidence_claimed == pytest.approx(8 / 9)
    assert sorted(behind["handoff_id"]) == ["early", "failed", "few", "late", "unclaimed", "unmet"]


def test_the_declared_contract_travels_on_the_spans(served):
    with served.client() as c:
        rows = c.query(
            f"SELECT handoff_id, event, attributes FROM {served.database}.handoff_transitions "
            "WHERE handoff_id IN ('edge', 'free') AND event IN ('create', 'prepare', 'commit')"
        ).result_rows
    by = {(h, e): dict(a) for h, e, a in rows}
    create = by[("edge", "create")]
    assert create["handoff.evidence_policy.valid_after"] == _iso(A)
    assert create["handoff.evidence_policy.valid_before"] == _iso(B)
    assert create["handoff.evidence_policy.min_refs"] == "2"
    assert create["handoff.evidence_policy.require_claims"] == "true"
    assert create["handoff.reply_contract.must_return"] == '["answer","sources"]'
    assert by[("edge", "prepare")]["handoff.result.fields"] == '["answer"]'
    assert by[("edge", "commit")]["handoff.result.fields"] == '["sources"]'
    # the free-text reply contract keeps working; no policy, no structured contract
    free = by[("free", "create")]
    assert free["handoff.reply_contract"] == "answer + sources"
    assert not [k for k in free if "evidence_policy" in k or k.endswith("must_return")]
