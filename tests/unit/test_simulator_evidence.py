"""The simulator's evidence policy and reply contract: every envelope declares them, ordinary
results meet them, and the two faults break them on exactly the handoffs they label (the
plans emitted through the real shim into an in-memory exporter, the spans judged by the
evidence checks' oracle, analytics.oracle.evidence)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics.oracle import evidence as ev
from collector import semconv as sc
from handoffs.simulator import (
    CLI_EVIDENCE_RATE,
    EVIDENCE_FAULTS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    SimulatorConfigError,
    plan_task,
)

T0 = 1_764_000_000 * 10**9
S = 10**9
KINDS = frozenset(ev.EVIDENCE_KINDS)


def _rows(rates: FailureRates, n: int) -> tuple[dict[str, list[dict]], dict[str, frozenset[str]]]:
    """Each handoff's spans as reference rows, and its planned labels."""
    exporter = InMemorySpanExporter()
    em = Emitter(exporter_factory=lambda tenant, token: exporter)
    labels: dict[str, frozenset[str]] = {}
    cfg = ScenarioConfig(seed=11, rates=rates)
    for i in range(n):
        plan = plan_task(cfg, i, T0 + i * 10 * S)
        labels.update({h.handoff_id: h.faults for h in plan.handoffs})
        em.emit_task(plan)
    em.close()
    rows: dict[str, list[dict]] = defaultdict(list)
    for span in exporter.get_finished_spans():
        a = dict(span.attributes or {})
        rows[str(a[sc.HANDOFF_ID])].append({
            "handoff_id": a[sc.HANDOFF_ID], "event": a[sc.EVENT], "from_state": a[sc.FROM_STATE],
            "to_state": a[sc.TO_STATE], "valid": a.get(sc.VALID, True), "time_ns": span.start_time,
            "evidence_count": a.get(sc.EVIDENCE_COUNT), "evidence_valid": a.get(sc.EVIDENCE_VALID),
            "attributes": {k: json.dumps(list(v)) if isinstance(v, tuple) else
                           str(v).lower() if isinstance(v, bool) else str(v) for k, v in a.items()},
        })  # fmt: skip
    return rows, labels


def test_ordinary_traffic_declares_the_checks_and_meets_them():
    rows, labels = _rows(FailureRates.none(), 60)
    creates = [r for hr in rows.values() for r in hr if r["event"] == "create"]
    assert creates and all(
        sc.EVIDENCE_POLICY_VALID_AFTER in r["attributes"]
        and r["attributes"][sc.REPLY_CONTRACT_MUST_RETURN] == '["answer", "sources"]'
        for r in creates
    )
    results = [r for hr in rows.values() for r in hr if sc.RESULT_FIELDS in r["attributes"]]
    assert results
    assert {h: ev.kinds(hr) for h, hr in rows.items() if ev.kinds(hr)} == {}
    assert not any(f & KINDS for f in labels.values())


def test_each_fault_is_flagged_on_the_handoffs_it_labels():
    rates = FailureRates.parse(
        "evidence_out_of_window=0.2,evidence_below_policy=0.2,reply_contract_unmet=0.2"
    )
    rows, labels = _rows(rates, 80)
    got = {h: set(ev.kinds(hr)) for h, hr in rows.items()}
    want = {h: set(labels[h] & KINDS) for h in rows}
    assert got == want
    seen = Counter(k for kinds in got.values() for k in kinds)
    # each injected kind shows, and the claims they dispute
    assert set(seen) == KINDS


def test_the_cli_starts_them_small_but_nonzero():
    cli = FailureRates.cli_defaults()
    assert all(getattr(cli, k) == CLI_EVIDENCE_RATE > 0 for k in EVIDENCE_FAULTS)
    assert all(getattr(FailureRates(), k) == 0 for k in EVIDENCE_FAULTS)
    with pytest.raises(SimulatorConfigError, match="reply_contract_unmet"):
        FailureRates.parse("reply-contract-unmet=2")
