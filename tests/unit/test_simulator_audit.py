"""The simulator's protocol-audit injections, on plans (pure) and through the real shim
(real OTel SDK, in-memory exporter): each kind's shape, and the ordinary traffic around."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handoffs.cli import main
from handoffs.simulator import (
    AUDIT_KINDS,
    CHAINED_KINDS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    SimulatorConfigError,
    plan_task,
)

T0 = 1_764_000_000 * 10**9
S = 10**9


def _only(kind: str, rate: float = 0.3) -> ScenarioConfig:
    spec = ",".join(f"{k}={rate if k == kind else 0}" for k in AUDIT_KINDS)
    return ScenarioConfig(rates=FailureRates.parse(spec))


def _ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()) * S


def _labelled(cfg: ScenarioConfig, kind: str, n: int = 200):
    """(plan, handoff) pairs whose handoff carries `kind`."""
    out = []
    for i in range(n):
        plan = plan_task(cfg, i, T0 + i * 10 * S)
        out += [(plan, h) for h in plan.handoffs if kind in h.faults]
    assert out, kind
    return out


def _steps(plan, hid):
    return [s for s in plan.steps if s.handoff_id == hid]


def test_every_audit_kind_is_a_rate_with_a_cli_flag():
    assert set(CHAINED_KINDS) <= set(AUDIT_KINDS)
    r = FailureRates.parse("blind_retry=0.02,duplicate-execution=0.01")
    assert (r.blind_retry, r.duplicate_execution) == (0.02, 0.01)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("blind_retry=1.5", "blind_retry"),
        ("wrong_consumer=-0.1", "wrong_consumer"),
        ("grant_expired=x", "grant_expired"),
        ("blind_retyr=0.1", "blind_retyr"),
    ],
)
def test_bad_audit_rates_name_themselves(spec, field):
    with pytest.raises(SimulatorConfigError) as e:
        FailureRates.parse(spec)
    assert e.value.field == field and field in str(e.value)


def test_audit_rates_together_at_most_one_chained_twice():
    with pytest.raises(SimulatorConfigError, match=r"audit rates sum to 1\.200"):
        FailureRates.parse(
            "consumed_before_verified=0.3,expired_receipt_used=0.3", base=FailureRates.none()
        )


def test_simulate_cli_names_a_bad_audit_rate(capsys):
    assert main(["simulate", "--rates", "grant_expired=2", "--handoffs", "1"]) == 2
    assert "grant_expired" in capsys.readouterr().err


def test_blind_retry_is_sent_while_the_first_attempt_is_unknown():
    for plan, b in _labelled(_only("blind_retry"), "blind_retry"):
        a_id = b.envelope["retry_of"]
        a = next(h for h in plan.handoffs if h.handoff_id == a_id)
        assert b.envelope["attempt"] == 2 and a.envelope["attempt"] == 1
        assert b.envelope["idempotency_key"] == a.envelope["idempotency_key"]
        assert b.envelope["payload_hash"] == a.envelope["payload_hash"]
        ev = {s.event: s.at_ns for s in _steps(plan, a_id)}
        assert ev["timeout"] < b.created_ns < ev["resolve_failed"]


def test_duplicate_execution_commits_the_same_key_twice():
    for plan, b in _labelled(_only("duplicate_execution"), "duplicate_execution"):
        a_id = b.envelope["retry_of"]
        a_commit = next(s.at_ns for s in _steps(plan, a_id) if s.event == "commit")
        b_commit = next(s.at_ns for s in _steps(plan, b.handoff_id) if s.event == "commit")
        assert a_commit < b.created_ns < b_commit


def test_consumers_of_a_receipt_before_read_back_or_after_expiry():
    for plan, c in _labelled(_only("consumed_before_verified"), "consumed_before_verified"):
        a = c.envelope["causation_id"]
        verify = next(s.at_ns for s in _steps(plan, a) if s.event == "verify")
        assert c.created_ns < verify
    for plan, c in _labelled(_only("expired_receipt_used"), "expired_receipt_used"):
        a_steps = _steps(plan, c.envelope["causation_id"])
        commit = next(s for s in a_steps if s.event == "commit")
        verify = next(s.at_ns for s in a_steps if s.event == "verify")
        assert verify < c.created_ns
        assert _ns(commit.attrs["receipt_expires_at"]) + 10 * S < c.created_ns


def test_envelope_kinds_change_only_their_own_field():
    for plan, h in _labelled(_only("wrong_consumer"), "wrong_consumer"):
        accept = next(s for s in _steps(plan, h.handoff_id) if s.event == "accept")
        assert accept.actor != h.envelope["to_agent"]
    for plan, h in _labelled(_only("grant_expired"), "grant_expired"):
        start = next(s for s in _steps(plan, h.handoff_id) if s.event == "start")
        assert _ns(h.envelope["grant"]["expires_at"]) < start.at_ns
    for _plan, h in _labelled(_only("capability_outside_grant"), "capability_outside_grant"):
        assert not set(h.envelope["capabilities"]) <= set(h.envelope["grant"]["capabilities"])
    for _plan, h in _labelled(_only("grant_tenant_mismatch"), "grant_tenant_mismatch"):
        assert h.envelope["grant"]["tenant"] != h.tenant
    for plan, h in _labelled(_only("tenant_claim_mismatch"), "tenant_claim_mismatch"):
        accept = next(s for s in _steps(plan, h.handoff_id) if s.event == "accept")
        assert accept.attrs["extra"]["handoff.tenant"] != h.tenant


def test_ordinary_traffic_is_clean_around_the_kinds():
    cfg = ScenarioConfig(rates=FailureRates.parse(",".join(f"{k}=0" for k in AUDIT_KINDS)))
    retries = causations = 0
    for i in range(300):
        plan = plan_task(cfg, i, T0 + i * 10 * S)
        by_id = {h.handoff_id: h for h in plan.handoffs}
        for h in plan.handoffs:
            e, g = h.envelope, h.envelope["grant"]
            assert set(e["capabilities"]) <= set(g["capabilities"]) and g["tenant"] == h.tenant
            mine = _steps(plan, h.handoff_id)
            for s in mine:
                if s.event in ("accept", "start", "commit", "prepare", "reject"):
                    assert s.actor == e["to_agent"]
                if s.event in ("start", "prepare", "commit"):
                    assert s.at_ns < _ns(g["expires_at"])
            if e.get("retry_of"):
                retries += 1
                prev = _steps(plan, e["retry_of"])
                assert prev[-1].at_ns < h.created_ns and prev[-1].event in (
                    "fail",
                    "resolve_failed",
                )
            cause = e.get("causation_id")
            if cause:
                causations += 1
                a = _steps(plan, cause)
                verify = next(s for s in a if s.event == "verify")
                commit = next(s for s in a if s.event in ("commit", "resolve_committed"))
                assert verify.at_ns < h.created_ns < _ns(commit.attrs["receipt_expires_at"])
                assert cause in by_id
    assert retries > 2 and causations > 100


def test_retries_go_through_the_shim_a_blind_one_flagged():
    exporters: dict[str, InMemorySpanExporter] = {}

    def factory(tenant, token):
        return exporters.setdefault(tenant, InMemorySpanExporter())

    em = Emitter(exporter_factory=factory)
    cfg = _only("blind_retry", 0.5)
    plans = [plan_task(cfg, i, T0 + i * 10 * S) for i in range(20)]
    for p in plans:
        em.emit_task(p)
    em.close()
    attrs: list[dict[str, Any]] = [
        dict(s.attributes or {}) for e in exporters.values() for s in e.get_finished_spans()
    ]
    creates = {a["handoff.handoff_id"]: a for a in attrs if a["handoff.event"] == "create"}
    blind = [h for p in plans for h in p.handoffs if "blind_retry" in h.faults]
    assert blind
    for h in blind:
        a = creates[h.handoff_id]
        assert a["handoff.retry_of"] == h.envelope["retry_of"] and a["handoff.attempt"] == 2
        assert a["handoff.retry_unresolved"] is True
        assert a["handoff.grant.tenant"] == h.tenant
    commits = [a for a in attrs if a["handoff.event"] == "commit"]
    assert all("handoff.receipt.id" in c and "handoff.receipt.expires_at" in c for c in commits)
    verifies = [a for a in attrs if a["handoff.event"] == "verify"]
    assert verifies and all(v["handoff.receipt.read_back"] is True for v in verifies)
