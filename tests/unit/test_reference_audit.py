"""analytics.oracle.audit.audit_anomalies on tiny histories: the boundaries of each kind."""

from __future__ import annotations

import json

from analytics.oracle.audit import audit_anomalies, iso_ns

S = 1_000_000_000
_T0 = iso_ns("2026-11-23T10:00:00Z")
assert _T0 is not None
T0 = _T0


def row(h: str, event: str, frm: str, to: str, sec: float, **kw) -> dict:
    base = {"tenant": "acme", "handoff_id": h, "task_id": kw.pop("task_id", f"t-{h}"),
            "event": event, "from_state": frm, "to_state": to, "time_ns": T0 + int(sec * S),
            "actor": kw.pop("actor", "worker"), "valid": True, "attributes": {}}  # fmt: skip
    base.update(kw)
    return base


def create(h: str, sec: float, **kw) -> dict:
    kw.setdefault("to_agent", "worker")
    return row(h, "create", "", "created", sec, actor="planner", **kw)


def test_iso_ns():
    assert iso_ns("2026-11-23T10:00:01.5Z") == T0 + 3 * S // 2
    assert iso_ns("2026-11-23T10:00:01") == T0 + S  # no offset: UTC
    assert iso_ns("") is None and iso_ns("soon") is None


def test_blind_retry_only_while_unknown():
    a = [create("a", 0, idempotency_key="k"), row("a", "timeout", "created", "unknown", 3),
         row("a", "resolve_failed", "unknown", "failed", 10)]  # fmt: skip
    during = create("b", 5, task_id="t-a", idempotency_key="k")
    after = create("c", 10, task_id="t-a", idempotency_key="k")  # at the resolution: not blind
    other_target = create("d", 5, task_id="t-a", idempotency_key="k", to_agent="coder")
    got = audit_anomalies([*a, during, after, other_target])
    assert got[("acme", "b")] == ["blind_retry"]
    assert got[("acme", "c")] == [] and got[("acme", "d")] == []


def test_duplicate_execution_is_the_later_commit():
    rows = [create("a", 0, idempotency_key="k"), create("b", 0, idempotency_key="k"),
            row("a", "commit", "running", "committed", 3), row("b", "commit", "running", "committed", 3)]  # fmt: skip
    got = audit_anomalies(rows)  # the same time: the greater id is the later
    assert (got[("acme", "a")], got[("acme", "b")]) == ([], ["duplicate_execution"])


def test_causation_and_grant_boundaries():
    exp = "2026-11-23T10:00:10Z"
    a = [create("a", 0),
         row("a", "commit", "running", "committed", 3,
             attributes={"handoff.receipt.expires_at": exp}),
         row("a", "verify", "committed", "verified", 5)]  # fmt: skip
    at_verify = create("c1", 5, attributes={"handoff.causation_id": "a"})
    at_expiry = create("c2", 10, attributes={"handoff.causation_id": "a"})
    late = create("c3", 10.001, attributes={"handoff.causation_id": "a"})
    grant = {"handoff.grant.expires_at": "2026-11-23T10:00:03Z",
             "handoff.grant.capabilities": json.dumps(["x"]), "handoff.grant.tenant": "other"}  # fmt: skip
    g = [create("g", 0, attributes=grant, capabilities=["x", "y"]),
         row("g", "commit", "running", "committed", 3, actor="intruder", claimed_tenant="evil")]  # fmt: skip
    got = audit_anomalies([*a, at_verify, at_expiry, late, *g])
    assert got[("acme", "c1")] == [] and got[("acme", "c2")] == []
    assert got[("acme", "c3")] == ["expired_receipt_used"]
    assert got[("acme", "g")] == ["capability_outside_grant", "grant_tenant_mismatch",
                                  "tenant_claim_mismatch", "wrong_consumer"]  # fmt: skip
