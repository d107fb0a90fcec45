"""The planner's topology faults and attributes (pure plans; one emitted through the real
shim into an in-memory exporter)."""

from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector import semconv as sc
from handoffs.simulator import (
    AGENTS,
    LEFT_BEHIND,
    TOPOLOGIES,
    TOPOLOGY_FAULTS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    SimulatorConfigError,
    plan_task,
)

T0 = 1_764_000_000 * 10**9
S = 10**9
ALL = FailureRates.parse(
    "unfiltered_sensitive_history=1,partial_result_committed=1,fan_out_all=1,consumer_lag=1,"
    "replay=1,stale_agent_card=1,schema_rollout=1,partial_result=0"
)


def _plans(n: int, rates: FailureRates = ALL, seed: int = 5):
    cfg = ScenarioConfig(seed=seed, rates=rates)
    return [plan_task(cfg, i, T0 + i * 10 * S) for i in range(n)]


def test_a_topology_fault_is_drawn_in_its_own_topology_only():
    own = {f: t for t, faults in TOPOLOGY_FAULTS.items() for f in faults}
    seen: Counter[str] = Counter()
    for p in _plans(300, FailureRates.cli_defaults()):
        for h in p.handoffs:
            for f in h.faults & set(own):
                assert own[f] == p.topology, (f, p.topology)
                seen[f] += 1
    assert set(seen) == set(own)


def test_each_topology_carries_its_own_attributes():
    by: dict[str, Counter[str]] = {t: Counter() for t in TOPOLOGIES}
    for p in _plans(200):
        for s in p.steps:
            by[p.topology].update(f"{s.event}:{k}" for k in s.attrs)
    assert by["in_process"]["create:history"] and not by["shared_queue"]["create:history"]
    assert by["federated_a2a"]["create:agent_card"] and not by["in_process"]["create:agent_card"]
    assert by["shared_queue"]["accept:queue"] and not by["agent_as_tool"]["accept:queue"]
    assert (
        by["agent_as_tool"]["commit:result_items"] and not by["shared_queue"]["commit:result_items"]
    )
    for t in TOPOLOGIES:
        # every consumer declares its window (a stale card's receiver on its reject)
        assert by[t]["accept:supported_versions"] + by[t]["reject:supported_versions"] > 0


def test_faulty_values_cross_the_thresholds():
    for p in _plans(200):
        created = {s.handoff_id: s.at_ns for s in p.steps if s.event == "create"}
        faults = {h.handoff_id: h.faults for h in p.handoffs}
        for s in p.steps:
            f = faults[s.handoff_id]
            if s.event == "accept" and "queue" in s.attrs and "consumer_lag" in f:
                q = s.attrs["queue"]
                assert s.at_ns - created[s.handoff_id] > 60 * S
                assert q.head_offset - q.offset > 1000
            if s.event == "create" and "history" in s.attrs:
                h = s.attrs["history"]
                bad = h.sensitive_items > h.removed_items
                assert bad == ("unfiltered_sensitive_history" in f)
            if s.event == "commit" and "result_items" in s.attrs:
                r = s.attrs["result_items"]
                assert r.partial == ("partial_result_committed" in f)


def test_fan_out_asks_every_other_agent_and_replays_are_marked():
    fanned = replayed = 0
    for p in _plans(120):
        labelled = [h for h in p.handoffs if "fan_out_all" in h.faults]
        if labelled:
            fanned += 1
            orchestrator = {h.envelope["from_agent"] for h in labelled}
            assert len(orchestrator) == 1
            experts = {h.envelope["to_agent"] for h in labelled}
            assert experts == set(AGENTS) - orchestrator
        copies = {s.handoff_id for s in p.steps if s.replay}
        for h in p.handoffs:
            if h.handoff_id in copies:
                replayed += 1
                kind = h.envelope["message_kind"]
                assert ("command_replayed" if kind == "command" else "replay") in h.faults
                assert all(s.replay for s in p.steps if s.handoff_id == h.handoff_id)
    assert fanned > 5 and replayed > 5


def test_the_consumer_left_behind_accepts_version_2_with_unknown_fields():
    for p in _plans(200):
        env = {h.handoff_id: h for h in p.handoffs}
        for s in p.steps:
            if s.event != "accept":
                continue
            h = env[s.handoff_id]
            behind = s.actor == LEFT_BEHIND and h.envelope["schema_version"] == 2
            assert ("incompatible_accepted" in h.faults) == behind
            assert bool(s.attrs.get("unknown_fields")) == behind
            risky = "amount_limit" in s.attrs.get("unknown_fields", ())
            assert ("risky_field_ignored" in h.faults) == risky


def test_topology_attributes_reach_the_spans():
    exporter = InMemorySpanExporter()
    em = Emitter(exporter_factory=lambda tenant, token: exporter)
    for p in _plans(40):
        em.emit_task(p)
    stats = em.close()
    keys = Counter(k for s in exporter.get_finished_spans() for k in s.attributes or {})
    for k in (sc.QUEUE_LAG_MS, sc.RESULT_ITEMS_RETURNED, sc.HISTORY_SENSITIVE_ITEMS,
              sc.AGENT_CARD_FETCHED_AT, sc.MESSAGE_KIND, sc.SCHEMA_VERSION, sc.REPLAY,
              sc.CONSUMER_SUPPORTED_VERSIONS, sc.ENVELOPE_UNKNOWN_FIELDS):  # fmt: skip
        assert keys[k] > 0, k
    assert set(stats.by_topology) == set(TOPOLOGIES)
    assert sum(t["intents"] for t in stats.by_topology.values()) == stats.intents


def test_a_bad_topology_rate_names_itself():
    with pytest.raises(SimulatorConfigError, match="consumer_lag"):
        FailureRates.parse("consumer_lag=1.5")
