"""Why a handoff was flagged (analytics.evidence._why, analytics.evidence._why_task): each
kind an evidence package can carry, from plain rows; the reference decides the kind, the
reason names the transition (or the other handoff) and the field that made it fire."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analytics.evidence import _why as why
from analytics.evidence import _why_task as why_task
from analytics.evidence._assemble import CROSS_KINDS, build_package
from analytics.oracle import funnel as ref
from analytics.oracle.audit import audit_anomalies
from foundation.integrity import derive_columns

T0 = 1_796_464_862_000_000_000  # 2026-12-05T10:01:02Z
S = 1_000_000_000
HOUR = 3600 * S


def row(
    hid: str,
    event: str,
    frm: str,
    to: str,
    t: float,
    *,
    actor: str = "coder",
    task: str = "t1",
    span: str | None = None,
    **attrs: Any,
) -> dict[str, Any]:
    """One handoff_transitions row: attributes by wire name (lists as JSON text), the typed
    columns derived from them as the store's view does."""
    a = {
        k: json.dumps(v)
        if isinstance(v, list)
        else str(v).lower()
        if isinstance(v, bool)
        else str(v)
        for k, v in attrs.items()
    }
    r: dict[str, Any] = {
        "tenant": "acme",
        "time_ns": T0 + int(t * S),
        "trace_id": "tr",
        "span_id": span or f"{hid}-{event}-{t}",
        "task_id": task,
        "handoff_id": hid,
        "event": event,
        "from_state": frm,
        "to_state": to,
        "actor": actor,
        "attributes": a,
    }
    r.update(derive_columns(a))
    return r


def create(
    hid: str,
    t: float = 0,
    *,
    frm: str = "planner",
    to: str = "coder",
    mode: str = "delegate",
    **attrs: Any,
) -> dict[str, Any]:
    env = {"handoff.from_agent": frm, "handoff.to_agent": to, "handoff.mode": mode}
    return row(hid, "create", "", "created", t, actor=frm, **env, **attrs)


def flow(hid: str = "h1", *, evidence: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    ev = (
        {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
        if evidence is None
        else evidence
    )
    return [
        create(hid),
        row(hid, "accept", "created", "accepted", 1),
        row(hid, "start", "accepted", "running", 2),
        row(hid, "commit", "running", "committed", 3, **ev),
    ]


def _kinds(rows, as_of_ns: int = T0 + HOUR) -> set[str]:
    own = set(ref.handoff_anomalies(rows, as_of_ns=as_of_ns))
    return own | set(audit_anomalies(rows).get(("acme", rows[0]["handoff_id"]), ()))


def _one(kind: str, rows, as_of_ns: int = T0 + HOUR) -> why.Reason:
    assert kind in _kinds(rows, as_of_ns), f"the reference does not flag {kind}"
    (got,) = why.handoff_reasons([kind], rows, as_of_ns=as_of_ns)
    assert got.kind == kind
    assert "no single transition" not in got.sentence
    return got


def test_committed_without_evidence_names_the_commit_and_its_flag() -> None:
    rows = flow(evidence={"handoff.evidence.count": 2, "handoff.evidence.valid": False})
    r = _one("committed_without_evidence", rows)
    assert (r.transition_span_id, r.field, r.value) == (
        "h1-commit-3",
        "handoff.evidence.valid",
        "false",
    )
    assert r.sentence == (
        "the commit (running → committed) at 2026-12-05T10:01:05Z (span h1-commit-3) "
        "carries handoff.evidence.valid = false"
    )


def test_committed_without_evidence_with_no_count() -> None:
    r = _one("committed_without_evidence", flow(evidence={"handoff.evidence.valid": True}))
    assert (r.field, r.value) == ("handoff.evidence.count", "(absent)")


def test_a_healthy_handoff_has_no_reason() -> None:
    rows = flow()
    assert _kinds(rows) == set()
    assert why.committed_without_evidence(rows) is None
    assert why.handoff_reasons([], rows, as_of_ns=T0) == []


def test_invalid_transition_flagged_row() -> None:
    invalid: dict[str, Any] = {"handoff.valid": False}
    rows = [*flow(), row("h1", "fail", "running", "failed", 4, **invalid)]
    r = _one("invalid_transition", rows)
    assert (r.transition_span_id, r.field, r.value) == ("h1-fail-4", "handoff.valid", "false")


def test_invalid_transition_fork() -> None:
    rows = [*flow()[:2], row("h1", "reject", "created", "rejected", 1.5)]
    r = _one("invalid_transition", rows)
    assert "two moves out of created" in r.sentence and r.field == "event"


def test_duplicate_delivery_names_the_second_span() -> None:
    rows = [*flow(), row("h1", "accept", "created", "accepted", 1.2, span="again")]
    r = _one("duplicate_delivery", rows)
    assert (r.transition_span_id, r.field, r.value) == ("again", "span_id", "again")


def test_clock_skew_names_the_early_transition() -> None:
    rows = flow()
    rows[2] = row("h1", "start", "accepted", "running", 0.5)  # before the accept at 1 s
    r = _one("clock_skew", rows)
    assert r.transition_span_id == "h1-start-0.5" and "0.5 s before" in r.sentence


def test_unknown_unresolved_says_how_long() -> None:
    rows = [*flow()[:3], row("h1", "timeout", "running", "unknown", 3)]
    r = _one("unknown_unresolved", rows)
    assert (r.transition_span_id, r.field, r.value) == ("h1-timeout-3", "to_state", "unknown")
    assert "over the 15 min SLA" in r.sentence


def test_accepted_never_started_names_the_deadline() -> None:
    deadline: dict[str, Any] = {"handoff.deadline_ms": 60_000}
    rows = [
        create("h1", **deadline),
        row("h1", "accept", "created", "accepted", 1),
    ]
    r = _one("accepted_never_started", rows)
    assert (r.field, r.value) == ("handoff.deadline_ms", "60000")
    assert "2026-12-05T10:02:02Z" in r.sentence


def test_implied_accept_names_the_first_move_past_accepted() -> None:
    rows = [flow()[0], *flow()[2:]]
    r = _one("implied_accept", rows)
    assert r.transition_span_id == "h1-start-2"


def test_orphan_transition_names_the_first_row() -> None:
    rows = flow()[1:]
    r = _one("orphan_transition", rows)
    assert r.transition_span_id == "h1-accept-1"


def test_wrong_consumer_names_the_actor() -> None:
    rows = flow()
    rows[1] = row("h1", "accept", "created", "accepted", 1, actor="intruder")
    r = _one("wrong_consumer", rows)
    assert (r.field, r.value) == (
        "actor",
        "intruder",
    ) and "not the envelope's to_agent coder" in r.sentence


def test_grant_expired_names_the_expiry() -> None:
    rows = flow()
    expiry: dict[str, Any] = {"handoff.grant.expires_at": "2026-12-05T10:01:03Z"}
    rows[0] = create("h1", **expiry)
    r = _one("grant_expired", rows)
    assert (r.transition_span_id, r.field, r.value) == (
        "h1-commit-3",
        "handoff.grant.expires_at",
        "2026-12-05T10:01:03Z",
    )


def test_capability_outside_grant_lists_the_extra_capabilities() -> None:
    rows = flow()
    asks: dict[str, Any] = {
        "handoff.capabilities": ["code.write", "deploy"],
        "handoff.grant.capabilities": ["code.write"],
    }
    rows[0] = create("h1", **asks)
    r = _one("capability_outside_grant", rows)
    assert r.value == '["deploy"]' and r.transition_span_id == rows[0]["span_id"]


def test_grant_tenant_mismatch_names_both_tenants() -> None:
    rows = flow()
    grant: dict[str, Any] = {"handoff.grant.tenant": "other"}
    rows[0] = create("h1", **grant)
    r = _one("grant_tenant_mismatch", rows)
    assert (r.field, r.value) == ("handoff.grant.tenant", "other") and "tenant acme" in r.sentence


def test_tenant_claim_mismatch_names_the_claim() -> None:
    rows = flow()
    rows[2] = row("h1", "start", "accepted", "running", 2, **{"handoff.tenant": "beta"})
    r = _one("tenant_claim_mismatch", rows)
    assert (r.transition_span_id, r.value) == ("h1-start-2", "beta")


# ------------------------------------------------------------------ cross-handoff kinds


def test_bounce_names_the_previous_transfer_and_the_gap() -> None:
    task = [
        create("h-a", 0, frm="planner", to="coder", mode="transfer"),
        create("h-b", 2.1, frm="coder", to="planner", mode="transfer"),
    ]
    assert ref.task_anomalies(task, "h-b") == ["bounce"]
    r = why_task.bounce(task, "h-b")
    assert r is not None and r.other_handoff_id == "h-a"
    assert (r.field, r.value) == ("handoff.to_agent", "planner")
    assert "h-a (planner → coder) was created 2.1 s before it" in r.sentence
    assert why_task.bounce(task, "h-a") is None


def test_stale_fence_names_the_row_that_raised_the_fence() -> None:
    fence_3: dict[str, Any] = {"handoff.fence_token": 3}
    fence_7: dict[str, Any] = {"handoff.fence_token": 7}
    task = [
        *flow("h-new"),
        create("h-old", 0.5),
        row("h-old", "commit", "running", "committed", 4, **fence_3),
    ]
    task[3] = row("h-new", "commit", "running", "committed", 3, **fence_7)
    assert ref.task_anomalies(task, "h-old") == ["stale_fence"]
    r = why_task.stale_fence(task, "h-old")
    assert r is not None
    assert (r.other_handoff_id, r.field, r.value) == ("h-new", "handoff.fence_token", "3")
    assert "below the 7 that h-new's commit" in r.sentence
    assert why_task.stale_fence(task, "h-new") is None


def test_idempotency_conflict_names_the_other_create() -> None:
    key: dict[str, Any] = {"handoff.idempotency_key": "k", "handoff.payload_hash": "p1"}
    own = create("h1", **key)
    other = {"handoff_id": "h2", "payload_hash": "p2", "time_ns": T0 + 5 * S}
    r = why_task.idempotency_conflict(own, other)
    assert (r.other_handoff_id, r.field, r.value) == ("h2", "handoff.idempotency_key", "k")
    assert "h2's create at 2026-12-05T10:01:07Z carries handoff.payload_hash = p2" in r.sentence
    assert why_task.cross_reasons(None, "db", ["idempotency_conflict"], [own], []) == [
        why_task.idempotency_conflict(own, None)
    ]


# ------------------------------------------------------------------ the package's field


def test_package_keeps_anomalies_and_adds_one_reason_per_kind() -> None:
    rows = [
        *flow(evidence={"handoff.evidence.valid": False}),
        row("h1", "accept", "created", "accepted", 1.2, span="again"),
    ]
    pkg = build_package(
        rows,
        ledger={},
        as_of_ns=T0 + HOUR,
        extra_anomalies=["bounce"],
        extra_reasons=[why.Reason("bounce", "handed back", other_handoff_id="h0")],
    )
    assert pkg["anomalies"] == ["bounce", "committed_without_evidence", "duplicate_delivery"]
    assert [a["kind"] for a in pkg["anomaly_reasons"]] == pkg["anomalies"]
    by = {a["kind"]: a["reason"] for a in pkg["anomaly_reasons"]}
    assert by["bounce"]["other_handoff_id"] == "h0"
    assert by["committed_without_evidence"]["field"] == "handoff.evidence.valid"
    assert set(by["duplicate_delivery"]) == {
        "kind",
        "sentence",
        "transition_span_id",
        "other_handoff_id",
        "field",
        "value",
    }


def test_a_cross_kind_without_its_reason_says_so() -> None:
    pkg = build_package(flow(), ledger={}, as_of_ns=T0, extra_anomalies=["stale_fence"])
    (only,) = pkg["anomaly_reasons"]
    assert only["kind"] == "stale_fence" and "cannot say why" in only["reason"]["sentence"]


@pytest.mark.parametrize("kind", sorted(why.ROW_KINDS | CROSS_KINDS))
def test_every_kind_a_package_carries_has_a_sentence(kind: str) -> None:
    got = why.reason_dicts([kind], [])
    assert got[0]["kind"] == kind and got[0]["reason"]["sentence"]
