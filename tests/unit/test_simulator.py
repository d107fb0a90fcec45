"""The simulator's pure planner and its emitter (real shim + real OTel SDK, in-memory exporter)."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector import IllegalTransition, next_state
from collector.contract import TERMINAL
from handoffs.cli import main
from handoffs.simulator import (
    AUDIT_KINDS,
    FAULTS,
    TOPOLOGIES,
    TOPOLOGY_FAULTS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    SimulatorConfigError,
    SkillOutage,
    backfill_starts,
    live_starts,
    merge_stats,
    plan_task,
    run_backfill,
)

T0 = 1_764_000_000 * 10**9  # 2025-11-24T16:00:00Z
S = 10**9
NO_AUDIT = ",".join(f"{k}=0" for k in AUDIT_KINDS)


def _plans(n: int, cfg: ScenarioConfig | None = None, start: int = T0):
    cfg = cfg or ScenarioConfig()
    return [plan_task(cfg, i, start + i * 10 * S) for i in range(n)]


# -- configuration errors name the field ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bounce": 1.5}, "bounce"),
        ({"timeout": -0.1}, "timeout"),
        ({"reject": "x"}, "reject"),
        (
            {"reject": 0.5, "fail": 0.6},
            "reject+expire+cancel+fail+timeout+partial_result+commit_fail",
        ),
        ({"timeout_resolve": 0.9, "timeout_escalate": 0.2}, "timeout_resolve+timeout_escalate"),
    ],
)
def test_failure_rates_refuse_bad_values(kwargs, field):
    with pytest.raises(SimulatorConfigError) as e:
        FailureRates(**kwargs)
    assert e.value.field == field
    assert field in str(e.value)


def test_rates_parse():
    r = FailureRates.parse("bounce=0.2, stale-fence=0.05")
    assert (r.bounce, r.stale_fence, r.timeout) == (0.2, 0.05, FailureRates().timeout)
    with pytest.raises(SimulatorConfigError, match="bouncy"):
        FailureRates.parse("bouncy=0.1")
    with pytest.raises(SimulatorConfigError, match="bounce: rate must be a number"):
        FailureRates.parse("bounce=lots")


def test_scenario_and_outage_validation():
    with pytest.raises(SimulatorConfigError, match="tenants"):
        ScenarioConfig(tenants={})
    with pytest.raises(SimulatorConfigError, match="weight of 'a'"):
        ScenarioConfig(tenants={"a": 0})
    with pytest.raises(SimulatorConfigError, match="latency_scale"):
        ScenarioConfig(latency_scale=0)
    with pytest.raises(SimulatorConfigError, match=r"outage\.end_ns"):
        SkillOutage("coder", "code.test", 10, 10)
    with pytest.raises(SimulatorConfigError, match="rate"):
        next(live_starts(1, 0, 0))
    with pytest.raises(SimulatorConfigError, match="window"):
        backfill_starts(1, 10, 5, 3)


# -- the plan -------------------------------------------------------------------------------


def test_plans_are_reproducible_and_independent_of_order():
    cfg = ScenarioConfig(seed=11)
    assert plan_task(cfg, 5, T0) == plan_task(cfg, 5, T0)
    assert plan_task(cfg, 5, T0) != plan_task(cfg, 6, T0)
    assert plan_task(cfg, 5, T0) != plan_task(ScenarioConfig(seed=12), 5, T0)


def test_every_planned_sequence_is_legal_except_the_injected_illegal_ones():
    illegal = 0
    for plan in _plans(1500):
        state: dict[str, str] = {}
        last: defaultdict[str, int] = defaultdict(int)
        for step in plan.steps:
            assert step.at_ns >= last[step.handoff_id], "steps of a handoff go forward in time"
            last[step.handoff_id] = step.at_ns
            if step.event == "redeliver":
                assert step.handoff_id in state
                continue
            if step.illegal:
                illegal += 1
                assert state[step.handoff_id] in TERMINAL | {"unknown"}
                with pytest.raises(IllegalTransition):
                    next_state(state[step.handoff_id], step.event)
                continue
            state[step.handoff_id] = next_state(state.get(step.handoff_id), step.event)
        assert {h.handoff_id for h in plan.handoffs} == set(state)
    assert illegal > 0


def test_traffic_covers_topologies_modes_tenants_and_every_failure_mode():
    plans = _plans(2500, ScenarioConfig(rates=FailureRates.cli_defaults()))
    assert {p.topology for p in plans} == set(TOPOLOGIES)
    handoffs = [h for p in plans for h in p.handoffs]
    assert {h.envelope["mode"] for h in handoffs} == {"delegate", "consult", "transfer", "escalate"}
    assert {h.tenant for h in handoffs} == {"acme", "globex", "initech"}
    assert (
        len(
            {h.envelope["from_agent"] for h in handoffs}
            | {h.envelope["to_agent"] for h in handoffs}
        )
        >= 6
    )
    seen = Counter(f for h in handoffs for f in h.faults)
    assert set(FAULTS) - {"skill_removed"} <= set(seen)  # the outage is off by default


@pytest.mark.parametrize("fault", ["bounce", "partial_result", "duplicate_delivery", "timeout"])
def test_injected_rates_are_rates_per_intent(fault):
    rate = 0.2
    plans = _plans(2000, ScenarioConfig(rates=FailureRates.parse(f"{fault}={rate}")))
    # a topology's own fault is a rate per intent of that topology
    own = {f: t for t, faults in TOPOLOGY_FAULTS.items() for f in faults}
    plans = [p for p in plans if own.get(fault, p.topology) == p.topology]
    intents = sum(p.intents for p in plans)
    labels = {"timeout": ("timeout_resolved", "timeout_escalated", "timeout_unresolved")}.get(
        fault, (fault,)
    )
    n = sum(1 for p in plans for h in p.handoffs if set(labels) & h.faults)
    sd = (rate * (1 - rate) / intents) ** 0.5
    assert abs(n / intents - rate) < 4 * sd


def test_no_failures_means_every_handoff_commits():
    for plan in _plans(300, ScenarioConfig(rates=FailureRates.none())):
        assert all(not h.faults for h in plan.handoffs)
        assert len(plan.handoffs) == plan.intents
        commits = {s.handoff_id for s in plan.steps if s.event == "commit"}
        assert commits == {h.handoff_id for h in plan.handoffs}
        for s in plan.steps:
            if s.event == "commit":
                assert s.attrs["evidence_valid"] is True and s.attrs["evidence_count"] >= 1


def test_bounce_is_a_transfer_handed_straight_back():
    cfg = ScenarioConfig(rates=FailureRates.parse("bounce=1"))
    # a wrong specialist is an in-process transfer's own failure
    plan = next(p for p in _plans(20, cfg) if p.topology == "in_process")
    hs = plan.handoffs
    first, back = hs[0], hs[1]
    assert "bounce" in first.faults
    assert first.envelope["mode"] == back.envelope["mode"] == "transfer"
    assert (back.envelope["from_agent"], back.envelope["to_agent"]) == (
        first.envelope["to_agent"],
        first.envelope["from_agent"],
    )
    assert hs[2].envelope["from_agent"] == first.envelope["from_agent"]
    assert hs[2].envelope["to_agent"] != first.envelope["to_agent"]


def test_stale_commits_carry_older_version_and_fence():
    cfg = ScenarioConfig(rates=FailureRates.parse("stale_state_version=1,stale_fence=1"))
    plan = plan_task(cfg, 2, T0)
    env = {h.handoff_id: h.envelope for h in plan.handoffs}
    for s in plan.steps:
        if s.event == "commit":
            assert s.attrs["state_version"] < env[s.handoff_id]["state_version"]
            assert s.attrs["fence_token"] < env[s.handoff_id]["fence_token"]


def test_idempotency_conflict_reuses_the_key_with_a_new_payload():
    plan = plan_task(ScenarioConfig(rates=FailureRates.parse("idempotency_conflict=1")), 3, T0)
    by_key = defaultdict(set)
    for h in plan.handoffs:
        by_key[h.envelope["idempotency_key"]].add(h.envelope["payload_hash"])
    assert any(len(v) == 2 for v in by_key.values())


def test_skill_outage_rejects_that_capability_inside_its_slice_only():
    outage = SkillOutage("coder", "code.test", T0 + 1000 * S, T0 + 2000 * S, reject_rate=1.0)
    # an audit intent succeeds whatever the outage says: none here
    # (nor a stale Agent Card nor a refused card skill: their rejections carry the same code)
    rates = FailureRates.parse(NO_AUDIT + ",stale_agent_card=0,card_skill_refused=0")
    cfg = ScenarioConfig(outage=outage, rates=rates)
    inside = rejected = outside = 0
    for plan in _plans(400, cfg):
        for h in plan.handoffs:
            e = h.envelope
            codes = [s.attrs.get("error_code") for s in plan.steps if s.handoff_id == h.handoff_id]
            if "unknown_capability" in codes:
                assert "skill_removed" in h.faults
            if (
                e["to_agent"] == "coder"
                and "code.test" in e["capabilities"]
                and "payload_changed" not in codes
            ):
                if outage.start_ns <= h.created_ns < outage.end_ns:
                    inside += 1
                    rejected += "unknown_capability" in codes
                else:
                    outside += 1
                    # decided when the intent began: only an attempt delayed past the slice start
                    # (after a bounce) can straddle the boundary
                    assert (
                        "unknown_capability" not in codes or h.created_ns < outage.end_ns + 600 * S
                    )
    assert inside > 3 and outside > 3
    assert rejected >= 0.9 * inside


def test_backfill_starts_are_sorted_in_window_and_diurnal():
    day = 86400 * S
    start = 1_763_942_400 * S  # Monday 2025-11-24 00:00 UTC
    starts = backfill_starts(3, start, start + 5 * day, 5000)
    assert starts == sorted(starts) and len(starts) == 5000
    assert start <= starts[0] and starts[-1] < start + 5 * day
    hours = Counter((t // S % 86400) // 3600 for t in starts)
    assert sum(hours[h] for h in range(12, 17)) > 3 * sum(hours[h] for h in range(0, 5))


def test_live_arrivals_match_the_rate():
    from handoffs.simulator import MEAN_INTENTS

    it = live_starts(5, 0, 10.0)
    ts = [next(it) for _ in range(4000)]
    tasks_per_s = len(ts) / (ts[-1] / S)
    assert abs(tasks_per_s * MEAN_INTENTS - 10.0) < 1.0


# -- the emitter: real shim, real SDK, in-memory exporters ----------------------------------


def _emitter():
    exporters: dict[str, InMemorySpanExporter] = {}
    tokens_seen: dict[str, str | None] = {}

    def factory(tenant, token):
        tokens_seen[tenant] = token
        exporters[tenant] = InMemorySpanExporter()
        return exporters[tenant]

    em = Emitter(exporter_factory=factory, tokens={"acme": "tok-a", "globex": "tok-g"})
    return em, exporters, tokens_seen


def test_emitter_sends_every_step_through_the_shim_per_tenant():
    em, exporters, tokens_seen = _emitter()
    cfg = ScenarioConfig(tenants={"acme": 1, "globex": 1, "initech": 1})
    plans = _plans(120, cfg)
    for p in plans:
        em.emit_task(p)
    stats = em.close()
    spans = [s for e in exporters.values() for s in e.get_finished_spans()]
    assert stats.spans == len(spans) == sum(len(p.steps) for p in plans)
    assert stats.exported == len(spans) and stats.export_failed == 0
    assert tokens_seen == {"acme": "tok-a", "globex": "tok-g", "initech": None}
    for tenant, exp in exporters.items():
        for s in exp.get_finished_spans():
            assert s.resource.attributes["handoffs.tenant"] == tenant
    by_hid = defaultdict(list)
    for s in spans:
        by_hid[s.attributes["handoff.handoff_id"]].append(s)
    for p in plans:
        for h in p.handoffs:
            hs = by_hid[h.handoff_id]
            assert len({s.context.trace_id for s in hs}) == 1, "receiver joins the sender's trace"
            create = [s for s in hs if s.attributes["handoff.event"] == "create"]
            assert len(create) == 1 and create[0].start_time == h.created_ns
            assert create[0].attributes["handoff.topology"] == p.topology
    assert stats.handoffs == sum(len(p.handoffs) for p in plans)


def test_emitter_duplicates_and_illegal_messages_are_what_the_plan_says():
    em, exporters, _ = _emitter()
    cfg = ScenarioConfig(
        tenants={"acme": 1},
        rates=FailureRates.parse(
            "duplicate_delivery=1,after_terminal=1,bounce=0,replay=0,fan_out_all=0," + NO_AUDIT
        ),
    )
    # duplicates are the shared queue's own failure, late messages federated A2A's
    plans = _plans(40, cfg)
    queue = next(p for p in plans if p.topology == "shared_queue")
    a2a = next(p for p in plans if p.topology == "federated_a2a")
    em.emit_task(queue)
    em.emit_task(a2a)
    em.close()
    spans = exporters["acme"].get_finished_spans()
    for plan, dup, bad_n in ((queue, 2, 0), (a2a, 1, 1)):
        for h in plan.handoffs:
            hs = [s for s in spans if s.attributes["handoff.handoff_id"] == h.handoff_id]
            keys = Counter(
                (s.attributes["handoff.event"], s.attributes["handoff.from_state"]) for s in hs
            )
            assert max(keys.values()) == dup, "one transition delivered twice"
            bad = [s for s in hs if s.attributes.get("handoff.valid") is False]
            assert len(bad) == bad_n
            assert all(b.attributes["handoff.event"] == "start" for b in bad)


def test_run_backfill_emits_in_the_window_with_progress_off():
    em, exporters, _ = _emitter()
    now = time.time_ns()
    stats = run_backfill(
        em, ScenarioConfig(), start_ns=now - 86400 * S, end_ns=now, handoffs=200, progress=False
    )
    em.close()
    creates = [
        s.start_time
        for e in exporters.values()
        for s in e.get_finished_spans()
        if s.attributes["handoff.event"] == "create"
    ]
    # hops planned after `now` are not sent (those tasks are still running)
    assert stats.handoffs - 10 <= len(creates) <= stats.handoffs
    assert all(now - 86400 * S <= t <= now for t in creates)
    assert abs(stats.intents - 200) <= 10


def test_simulate_cli_refuses_bad_rates(capsys):
    assert main(["simulate", "--bounce-rate", "2", "--no-progress"]) == 2
    assert "bounce" in capsys.readouterr().err
    assert main(["simulate", "--outage", "coder@x", "--no-progress"]) == 2


def test_random_module_state_is_untouched():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    _plans(20)
    assert random.random() == expected


def test_backfill_shards_partition_the_single_run():
    now = time.time_ns()
    kw: dict[str, Any] = {
        "start_ns": now - 86400 * S,
        "end_ns": now,
        "handoffs": 150,
        "progress": False,
    }
    em, _, _ = _emitter()
    whole = run_backfill(em, ScenarioConfig(), **kw)
    parts = []
    for i in range(3):
        em_i, _, _ = _emitter()
        parts.append(run_backfill(em_i, ScenarioConfig(), shard=(i, 3), **kw))
    merged = merge_stats(parts)
    assert (merged.tasks, merged.intents, merged.handoffs, merged.spans) == (
        whole.tasks,
        whole.intents,
        whole.handoffs,
        whole.spans,
    )
    assert merged.faults == whole.faults
    with pytest.raises(SimulatorConfigError, match="shard"):
        run_backfill(em, ScenarioConfig(), shard=(3, 3), **kw)
