"""Each topology's own injected failures are recovered per topology, and only there.

A seeded backfill (~1200 handoff intents over a day, each topology's own faults at high
rates, a schema-version rollout with billing left behind, the protocol-audit kinds off)
goes through the real shim and the real OTLP/HTTP exporter into `handoffs serve`
(subprocess, embedded chDB); the anomalies are read back over serve's query port and split
by the flagged handoffs' topology.

Tolerance: per topology and kind, the flagged handoffs are within 5% (at least 2) of the
handoffs the planner labelled; a topology's own kind flags nothing in the other three; the
labelled count is within 4 binomial standard deviations of the configured rate per intent
of the topology. analytics.topology_cards counts the same handoffs per topology.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from analytics import Window, anomaly_handoff_ids, topology_cards
from handoffs.simulator import (
    AUDIT_KINDS,
    TOPOLOGIES,
    TOPOLOGY_FAULTS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    otlp_exporter_factory,
    run_backfill,
)

S = 10**9
INTENTS = 1200
RATES = FailureRates.parse(
    "bounce=0.15,unfiltered_sensitive_history=0.3,partial_result=0.04,"
    "partial_result_committed=0.15,fan_out_all=0.1,duplicate_delivery=0.15,consumer_lag=0.15,"
    "replay=0.1,after_terminal=0.12,stale_agent_card=0.15,schema_rollout=0.5,"
    + ",".join(f"{k}=0" for k in AUDIT_KINDS)
)
TOKENS = {"acme": "tok-acme", "globex": "tok-globex"}
#: planner label -> the anomaly kind that flags it
KIND_OF = {
    "bounce": "bounce",
    "unfiltered_sensitive_history": "unfiltered_sensitive_history",
    "partial_result_committed": "partial_result_committed",
    "fan_out_all": "fan_out_all",
    "duplicate_delivery": "duplicate_delivery",
    "consumer_lag": "consumer_lag",
    "command_replayed": "command_replayed",
    "after_terminal": "invalid_transition",
    "stale_agent_card": "stale_agent_card",
    "card_skill_refused": "card_skill_refused",
    "consumer_stalled": "consumer_stalled",
    "incompatible_accepted": "incompatible_accepted",
    "risky_field_ignored": "risky_field_ignored",
}
OWN = {f: t for t, faults in TOPOLOGY_FAULTS.items() for f in faults if f in KIND_OF}
#: labels drawn once per intent of their topology, at the rate of the same name
PER_INTENT = ("bounce", "consumer_lag", "duplicate_delivery", "after_terminal", "stale_agent_card")


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / S, tz=UTC)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from serve.testing import start_serve

    serve = start_serve(
        tmp_path_factory.mktemp("simtopo"), ",".join(f"{t}={n}" for n, t in TOKENS.items())
    )
    try:
        # a full hour 2 h ago at least: no step is planned in the wall clock's future
        end = (time.time_ns() // (3600 * S)) * 3600 * S - 2 * 3600 * S
        start = end - 86400 * S
        cfg = ScenarioConfig(seed=24, tenants=dict.fromkeys(TOKENS, 1.0), rates=RATES)
        emitter = Emitter(exporter_factory=otlp_exporter_factory(serve.otlp_url), tokens=TOKENS)
        run_backfill(emitter, cfg, start_ns=start, end_ns=end, handoffs=INTENTS, progress=False)
        stats = emitter.close()
        assert stats.export_failed == 0 and stats.exported == stats.spans
        serve.wait_stored(120)
        client = serve.client()
        # replays and fan-outs come minutes after their task starts: an hour past the end
        w = Window(start=_dt(start), end=_dt(end + 3600 * S), as_of=_dt(end + 3600 * S))
        topo = {
            h: t
            for h, t in client.query(
                f"SELECT handoff_id, any(topology) FROM {serve.database}.handoff_transitions "
                "WHERE event = 'create' GROUP BY handoff_id"
            ).result_rows
        }
        flagged = {}
        for kind in set(KIND_OF.values()):
            ids = anomaly_handoff_ids(
                client, database=serve.database, window=w, kind=kind, limit=100_000
            )
            flagged[kind] = Counter(topo[h] for h in ids)
        cards = topology_cards(client, w, database=serve.database)
        yield {"stats": stats, "flagged": flagged, "cards": cards}
        client.close()
    finally:
        serve.stop()


def _close(observed: int, expected: int) -> bool:
    return abs(observed - expected) <= max(2, 0.05 * expected)


@pytest.mark.parametrize("label", sorted(KIND_OF))
def test_each_topology_fault_is_recovered_in_its_topology_only(simulated, label):
    by_topology = simulated["stats"].by_topology
    got = simulated["flagged"][KIND_OF[label]]
    for topology in TOPOLOGIES:
        injected = by_topology[topology].get(label, 0)
        if label in OWN and topology != OWN[label]:
            assert injected == 0 and got[topology] == 0, (label, topology, got)
        else:
            assert injected > 0, (label, topology)
            assert _close(got[topology], injected), (label, topology, got[topology], injected)


def test_injected_rates_per_intent_of_the_topology(simulated):
    by_topology = simulated["stats"].by_topology
    for label in PER_INTENT:
        t = by_topology[OWN[label]]
        rate, n = getattr(RATES, label), t["intents"]
        sd = (rate * (1 - rate) / n) ** 0.5
        assert abs(t.get(label, 0) / n - rate) < 4 * sd, (label, t.get(label, 0), n)
    agent_tool = by_topology["agent_as_tool"]
    fanned = agent_tool.get("fan_out_all", 0) / 7  # 7 handoffs of the orchestrator per task
    sd = (RATES.fan_out_all * (1 - RATES.fan_out_all) / agent_tool["tasks"]) ** 0.5
    assert fanned / agent_tool["tasks"] == pytest.approx(RATES.fan_out_all, abs=4 * sd + 0.02)


def test_topology_cards_count_the_same_handoffs(simulated):
    cards, flagged = simulated["cards"], simulated["flagged"]
    assert list(cards["topology"].unique()) == list(TOPOLOGIES)
    for row in cards.itertuples():
        if row.kind in flagged:
            assert row.flagged == flagged[row.kind][row.topology], row
        assert row.rate == pytest.approx(row.flagged / row.handoffs if row.handoffs else 0.0)
    # each topology's cards show its own failures, at rates the others do not have
    rate = {(r.topology, r.kind): r.rate for r in cards.itertuples()}
    for topology, kind in [
        ("in_process", "bounce"),
        ("in_process", "unfiltered_sensitive_history"),
        ("agent_as_tool", "partial_result_committed"),
        ("agent_as_tool", "fan_out_all"),
        ("shared_queue", "consumer_lag"),
        ("federated_a2a", "invalid_transition"),
        ("federated_a2a", "stale_agent_card"),
    ]:
        assert rate[(topology, kind)] > 0.02, (topology, kind, rate)
        others = [t for t in TOPOLOGIES if t != topology]
        assert all(flagged[kind][t] == 0 for t in others), (kind, flagged[kind])
