"""The evidence checks' oracle (analytics.oracle.evidence) on hand-built rows: the window's
edges, missing and malformed times, distinct refs, claims, the first result transition,
the reply contract over every result, and the checked V(h) of analytics.oracle.funnel."""

from __future__ import annotations

import json

from analytics.oracle import evidence as ev
from analytics.oracle import funnel as ref

AFTER = "2026-12-01T10:00:00Z"
BEFORE = "2026-12-01T12:00:00Z"
S = 10**9


def row(event: str, f: str, t: str, at: int, attrs: dict | None = None, **kw) -> dict:
    a = {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in (attrs or {}).items()}
    return {"handoff_id": "h", "event": event, "from_state": f, "to_state": t,
            "time_ns": at * S, "attributes": a, **kw}  # fmt: skip


def create(**policy) -> dict:
    keys = {
        "after": "handoff.evidence_policy.valid_after",
        "before": "handoff.evidence_policy.valid_before",
        "min_refs": "handoff.evidence_policy.min_refs",
        "claims": "handoff.evidence_policy.require_claims",
        "must": "handoff.reply_contract.must_return",
    }
    attrs = {keys[k]: ("true" if v is True else v) for k, v in policy.items()}
    return row("create", "", "created", 0, attrs)


def result(event: str, f: str, t: str, at: int, refs: list, *, valid_at=None, claims=None,
           fields=None, ok: bool = True, **kw) -> dict:  # fmt: skip
    a: dict = {"handoff.evidence_refs": refs}
    if valid_at is not None:
        a["handoff.evidence.valid_at"] = valid_at
    if claims is not None:
        a["handoff.evidence.claims"] = claims
    if fields is not None:
        a["handoff.result.fields"] = fields
    return row(event, f, t, at, a, evidence_count=len(refs), evidence_valid=ok, **kw)


RUN = [row("accept", "created", "accepted", 1), row("start", "accepted", "running", 2)]


def commit(refs: list, **kw) -> list[dict]:
    return [*RUN, result("commit", "running", "committed", 3, refs, **kw)]


def test_the_window_includes_valid_after_and_excludes_valid_before():
    def out(*valid_at: str) -> bool:
        refs = [f"r{i}" for i in range(len(valid_at))]
        rows = [create(after=AFTER, before=BEFORE), *commit(refs, valid_at=list(valid_at))]
        return ev.check(rows).out_of_window

    assert not out(AFTER, "2026-12-01T11:59:59.999999Z")
    assert out("2026-12-01T09:59:59.999999Z")
    assert out(BEFORE)
    assert not out("2026-12-01T12:00:00+01:00")  # 11:00 UTC
    assert out("")  # no time: not shown inside the window
    assert out("1764583200")  # a bare number is not an ISO-8601 time
    # a ref beyond the valid_at array has no time
    rows = [create(after=AFTER), *commit(["a", "b"], valid_at=[AFTER])]
    assert ev.check(rows).out_of_window
    # no window declared: any time, or none, passes
    assert not ev.check([create(min_refs=0), *commit(["a"], valid_at=["x"])]).out_of_window


def test_min_refs_counts_distinct_ids_and_claims_are_per_ref():
    def below(refs, given=None, **policy) -> bool:
        return ev.check([create(**policy), *commit(refs, claims=given)]).below_policy

    assert not below(["a", "b"], min_refs=2)
    assert below(["a", "a", ""], min_refs=2)
    assert not below([], min_refs=0)
    assert below(["a", "b"], ["x"], claims=True)  # the second ref has none
    assert below(["a"], [""], claims=True)
    assert not below(["a", "b"], ["x", "y"], claims=True)
    assert not below([], None, claims=True)
    assert not below(["a"], None, claims=False)


def test_the_first_result_transition_is_checked_copies_included():
    pol = create(after=AFTER)
    good, bad = [AFTER], ["2026-12-01T09:00:00Z"]
    prepared = [*RUN, result("prepare", "running", "prepared", 3, ["a"], valid_at=good)]
    then_bad = result("commit", "prepared", "committed", 4, ["a"], valid_at=bad)
    assert not ev.check([pol, *prepared, then_bad]).out_of_window  # the commit is not first
    copy = result("prepare", "running", "prepared", 5, ["a"], valid_at=bad, span_id="2")
    assert ev.check([pol, *prepared, copy]).out_of_window  # one of its rows fails: it fails
    uncounted = {**copy, "valid": False}
    assert not ev.check([pol, *prepared, uncounted]).out_of_window


def test_the_reply_contract_reads_every_counted_result():
    pol = create(must=["answer", "sources"])
    split = [
        *RUN,
        result("prepare", "running", "prepared", 3, ["a"], fields=["answer"]),
        result("commit", "prepared", "committed", 4, ["a"], fields=["sources", "cost"]),
    ]
    assert not ev.check([pol, *split]).contract_unmet
    lost = [*split[:-1], {**split[-1], "valid": False}]
    assert ev.check([pol, *lost]).contract_unmet
    assert not ev.check([create(must=[]), *commit(["a"])]).contract_unmet
    assert not ev.check([create(after=AFTER), *commit(["a"], valid_at=[AFTER])]).contract_unmet


def test_the_envelope_takes_the_greatest_value_of_its_create_rows():
    rows = [create(min_refs=1, after="2026-12-01T09:00:00Z"),
            {**create(min_refs=3, after=AFTER), "span_id": "2"}, *commit(["a", "b"], valid_at=[AFTER] * 2)]  # fmt: skip
    p = ev.policy(rows)
    assert (p.min_refs, p.valid_after_ns) == (3, ev.time_ns(AFTER))
    assert ev.check(rows).below_policy


def test_kinds_and_the_checked_v():
    start, end = 0, 10 * S
    unmet = [create(must=["answer"]), *commit(["a"], fields=[])]
    got = ev.evidence_anomalies(unmet, start_ns=start, end_ns=end)
    assert got == {("default", "h"): ["evidence_claim_disputed", "reply_contract_unmet"]}
    # not committed: the contract is unmet, the claim disputed, no reply_contract_unmet
    failed = [create(must=["answer"]), *RUN,
              result("prepare", "running", "prepared", 3, ["a"]), row("fail", "prepared", "failed", 4)]  # fmt: skip
    assert ev.evidence_anomalies(failed, start_ns=start, end_ns=end) == {
        ("default", "h"): ["evidence_claim_disputed"]
    }
    # the emitter did not claim it valid: the check fails, nothing is disputed
    honest = [create(must=["answer"]), *commit(["a"], fields=[], ok=False)]
    assert ev.evidence_anomalies(honest, start_ns=start, end_ns=end) == {
        ("default", "h"): ["reply_contract_unmet"]
    }
    f = ref.facts("h", unmet, as_of_ns=end)
    assert (f.e, f.v_claimed, f.v, f.k) == (True, True, False, False)
    assert "committed_without_evidence" in ref.handoff_anomalies(unmet, as_of_ns=end)
    counts = ref.funnel_counts(unmet + [{**r, "handoff_id": "free"} for r in [create(), *commit(["a"])]],
                               start_ns=start, end_ns=end, as_of_ns=end)  # fmt: skip
    assert (counts["executed"], counts["evidence_claimed"], counts["evidenced"]) == (2, 2, 1)
    assert (counts["p_evidence"], counts["p_evidence_claimed"]) == (0.5, 1.0)
    # outside the window: not in the cohort
    assert ev.evidence_anomalies(unmet, start_ns=S, end_ns=end) == {}
