"""Simulated traffic with the envelope's promises broken (deadline_overrun,
tool_budget_exceeded, ack_missing at 5% each, over the default faults) through the real
shim and OTLP/HTTP exporter into a real `handoffs serve`: each kind flags exactly the
handoffs the planner labelled, injected and ordinary (a timeout resolved after the
deadline, a message that expired unacknowledged) alike."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from analytics import Window, anomaly_handoff_ids
from handoffs.simulator import (
    Emitter,
    FailureRates,
    ScenarioConfig,
    otlp_exporter_factory,
    plan_task,
)
from handoffs.simulator._model import BUDGET_FAULTS

S = 10**9
HOUR = 3600 * S
TASKS = 150


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / S, tz=UTC)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from serve.testing import start_serve

    serve = start_serve(tmp_path_factory.mktemp("simbudget"))
    try:
        start = (time.time_ns() // HOUR - 8) * HOUR
        rates = FailureRates.parse(",".join(f"{k}=0.05" for k in BUDGET_FAULTS))
        cfg = ScenarioConfig(seed=23, rates=rates)
        plans = [plan_task(cfg, i, start + i * 30 * S) for i in range(TASKS)]
        emitter = Emitter(exporter_factory=otlp_exporter_factory(serve.otlp_url))
        for plan in plans:
            emitter.emit_task(plan)
        stats = emitter.close()
        assert stats.export_failed == 0 and stats.exported == stats.spans
        serve.wait_stored(120)
        w = Window(start=_dt(start), end=_dt(start + 3 * HOUR), as_of=_dt(start + 6 * HOUR))
        with serve.client() as c:
            got = {
                k: anomaly_handoff_ids(c, database=serve.database, window=w, kind=k, limit=10**6)
                for k in BUDGET_FAULTS
            }
        labelled = {
            k: sorted(h.handoff_id for p in plans for h in p.handoffs if k in h.faults)
            for k in BUDGET_FAULTS
        }
        yield got, labelled
    finally:
        serve.stop()


@pytest.mark.parametrize("kind", BUDGET_FAULTS)
def test_each_kind_flags_exactly_the_labelled_handoffs(simulated, kind):
    got, labelled = simulated
    assert len(labelled[kind]) >= 5, labelled[kind]
    assert got[kind] == labelled[kind]
