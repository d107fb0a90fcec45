"""The simulator's injections of what senders do without declaring it are recovered exactly:
tasks planned with only those rates (INFERRED_FAULTS at 10% per intent, every other fault
off), driven through the real shim and OTel SDK into an in-memory exporter per tenant, their
spans stored as the exporter hands them over (the tenant its exporter's) in a fresh
database. Each anomaly kind flags exactly the handoffs the planner labelled with it, and the
ordinary attempts around them (their first attempts, refusals, grants) none.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics import Window, anomalies
from analytics.oracle.inferred import INFERRED_KINDS
from handoffs.simulator import INFERRED_FAULTS, Emitter, FailureRates, ScenarioConfig, plan_task
from tests.analytics_seed import T, seed

S = 10**9
T0 = 1_764_000_000 * S
TASKS = 150
KINDS = ("blind_retry", *INFERRED_KINDS)
_IDENTITY = ("handoff.task_id", "handoff.handoff_id", "handoff.event", "handoff.from_state",
             "handoff.to_state", "handoff.actor")  # fmt: skip


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // S, UTC).replace(microsecond=ns % S // 1000)


def _rows(exporters: dict[str, InMemorySpanExporter]) -> list[T]:
    out = []
    for tenant, exporter in exporters.items():
        for s in exporter.get_finished_spans():
            a: dict[str, Any] = dict(s.attributes or {})
            assert s.start_time is not None
            out.append(T(a["handoff.handoff_id"], a["handoff.event"], a["handoff.from_state"],
                         a["handoff.to_state"], _dt(s.start_time), task_id=a["handoff.task_id"],
                         actor=a["handoff.actor"], tenant=tenant,
                         attrs={k: v for k, v in a.items() if k not in _IDENTITY},
                         span_id=f"{s.context.span_id:016x}",
                         trace_id=f"{s.context.trace_id:032x}"))  # fmt: skip
    return out


def test_each_injected_kind_is_flagged_on_its_labelled_handoffs_only(
    chdb_client, fresh_db, monkeypatch
):
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")  # missing_grant needs the policy
    spec = ",".join(f"{k}=0.1" for k in INFERRED_FAULTS)
    cfg = ScenarioConfig(seed=11, rates=FailureRates.parse(spec, base=FailureRates.none()))
    exporters: dict[str, InMemorySpanExporter] = {}
    em = Emitter(exporter_factory=lambda tenant, _token: exporters.setdefault(
        tenant, InMemorySpanExporter()))  # fmt: skip
    plans = [plan_task(cfg, i, T0 + i * 60 * S) for i in range(TASKS)]
    for p in plans:
        em.emit_task(p)
    stats = em.close()
    assert stats.spans == sum(len(p.steps) for p in plans)
    seed(chdb_client, fresh_db, _rows(exporters), ledger=False)
    w = Window(start=_dt(T0), end=_dt(T0 + (TASKS + 120) * 60 * S),
               as_of=_dt(T0 + (TASKS + 240) * 60 * S))  # fmt: skip
    df = anomalies(chdb_client, database=fresh_db, window=w, kinds=KINDS, examples=10_000)
    got = {r.kind: sorted(r.examples) for r in df.itertuples()}
    labelled = {
        k: sorted(h.handoff_id for p in plans for h in p.handoffs if k in h.faults) for k in KINDS
    }
    assert all(len(ids) >= 5 for ids in labelled.values()), labelled
    assert got == labelled
