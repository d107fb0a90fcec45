"""The pure half of the simulator: plans tasks of handoffs as timed steps, no I/O.

`plan_task(config, seq, start_ns)` returns one TaskPlan (start times: _arrivals.py; the
fleet: _catalog.py). Each task draws from its own random.Random seeded by (config.seed, seq), so a plan is
reproducible and independent of how many tasks come before it. Every step sequence is legal
under collector.contract except steps marked `illegal` (the after_terminal fault).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from handoffs.simulator._attempt import (
    Result,
    Shape,
    attempt,
    draw_audit,
    draw_outcome,
    impostor,
    shape_for,
)
from handoffs.simulator._budget import label_budget
from handoffs.simulator._builder import (
    CONSUME_LATE_NS,
    RETRY_AFTER_FAIL_P,
    SHORT_RECEIPT_TTL_NS,
    VERIFY_P_LAST,
    VERIFY_P_NEXT,
    Builder,
)
from handoffs.simulator._catalog import (
    ACCEPT_MS,
    AGENTS,
    RISKY_V2_FIELDS,
    SUPPORTED_VERSIONS,
    TOPOLOGIES,
    TOPOLOGY_WEIGHTS,
    WORKFLOW_WEIGHTS,
    WORKFLOWS,
    Hop,
)
from handoffs.simulator._inferred import draw_inferred, plan_inferred
from handoffs.simulator._model import (
    CHAINED_KINDS,
    ScenarioConfig,
    SimulatorConfigError,
    TaskPlan,
)

__all__ = ["plan_task"]


def plan_task(config: ScenarioConfig, seq: int, start_ns: int) -> TaskPlan:
    """Plan task number `seq` starting at start_ns (ns since epoch). Pure and deterministic.

    A hop names the previous hop's committed attempt as its causation only when that result
    was read back (verified) before the hop was created, except where an audit kind says
    otherwise (consumed_before_verified, expired_receipt_used).
    """
    if start_ns < 0:
        raise SimulatorConfigError("start_ns", "must be >= 0 (ns since the Unix epoch)")
    rng = random.Random(f"{config.seed}:{seq}")
    tenant = rng.choices(list(config.tenants), weights=list(config.tenants.values()))[0]
    topology = rng.choices(TOPOLOGIES, weights=TOPOLOGY_WEIGHTS)[0]
    _, _, hops = rng.choices(WORKFLOWS, weights=WORKFLOW_WEIGHTS)[0]
    task_id = f"{config.id_prefix}t{seq:x}-{rng.getrandbits(32):08x}"
    b = Builder(config, rng, task_id, tenant, topology)
    n = len(hops)
    audit = [draw_audit(config, rng, j, n) for j in range(n)]
    inferred = [draw_inferred(config, rng, hop, topology) for hop in hops]
    # agent-as-tool: the first orchestrator asks every expert at once (per task)
    fan_out = topology == "agent_as_tool" and rng.random() < config.rates.fan_out_all
    t = start_ns
    producer: Result | None = None  # the previous hop's committed attempt
    for j, hop in enumerate(hops):
        kind = audit[j]
        after = audit[j + 1] if j + 1 < n else None
        # what a sender does without declaring it (_inferred.py): on an intent without an
        # audit kind that feeds no chained one
        told = inferred[j] if kind is None and after not in CHAINED_KINDS else None
        outcome, overlays = draw_outcome(b, hop, t)
        if kind is not None or after in CHAINED_KINDS or told is not None:
            # an audit intent, or the producer an audit consumer needs: a clean success
            outcome, overlays = "success", frozenset()
        verify_p = VERIFY_P_NEXT if j + 1 < n else VERIFY_P_LAST
        # the fan-out goes out beside the hop's own call
        fan_end = _fan_out(b, hop, t) if fan_out and j == 0 else t
        # the attempt the next hop consumes: read back late, or with a short-lived receipt
        feeds: dict[str, Any] = {}
        if after == "consumed_before_verified":
            feeds = {"verify": "later"}
        elif after == "expired_receipt_used":
            feeds = {"verify": "now", "receipt_ttl_ns": SHORT_RECEIPT_TTL_NS}
        causation = producer.hid if producer is not None and producer.verified else None
        if kind in CHAINED_KINDS:
            if producer is None or producer.commit_ns is None:
                raise AssertionError("a chained audit kind without a committed producer")
            causation = producer.hid
            if kind == "consumed_before_verified":
                # the receipt is read back only after this hop already consumed it
                b.verify(producer.hid, t + b.ms(1500), hops[j - 1].from_agent)
            else:
                t = max(t, producer.commit_ns + CONSUME_LATE_NS)
        if "bounce" in overlays:
            wrong = impostor(b, hop)
            first = Hop(hop.from_agent, wrong, "transfer", hop.capabilities, hop.objective)
            h1 = b.create(first, t, faults=frozenset({"bounce"}))
            t = b.step(h1, "accept", t + b.ms(ACCEPT_MS[topology]), wrong)
            t = b.step(h1, "start", t + b.ms(30), wrong)
            back = Hop(wrong, hop.from_agent, "transfer", (), "not mine: " + hop.objective)
            t += b.ms(3000)
            h2 = b.create(back, t)
            b.step(h1, "fail", t + b.ms(20), wrong, error_code="wrong_specialist")
            t = b.step(h2, "accept", t + b.ms(ACCEPT_MS[topology]), hop.from_agent)
            t = b.step(h2, "start", t + b.ms(20), hop.from_agent)
            at = t + b.ms(500)
            t = b.step(
                h2,
                "commit",
                at,
                hop.from_agent,
                **b.result(h2, at, True, stale_version=False, stale_fence=False),
            )
            b.version += 1
            t += b.ms(1000)
        key = None
        if "idempotency_conflict" in overlays:
            # first send canceled, retried under the same key with a changed payload
            key = f"{task_id}:{hop.to_agent}:retry"
            h0 = b.create(hop, t, key=key, payload_salt="v1")
            t = b.step(h0, "cancel", t + b.ms(2000), hop.from_agent, error_code="payload_changed")
            t += b.ms(500)
        common: dict[str, Any] = {"key": key, "payload_salt": "v2" if key else ""}
        if kind == "blind_retry":
            a1 = attempt(
                b, hop, t, outcome="blind_first", overlays=frozenset(), causation=causation
            )
            res = attempt(
                b,
                hop,
                a1.end_ns + b.ms(1000),
                outcome="success",
                overlays=frozenset(),
                retry_of=a1.hid,
                label=kind,
                verify_p=verify_p,
                shape=Shape(**feeds),
            )
            # the first attempt's outcome is learned only after the retry went out
            b.step(
                a1.hid, "resolve_failed", res.end_ns + b.ms(5000), hop.to_agent,
                error_code="superseded",
            )  # fmt: skip
        elif kind == "duplicate_execution":
            a1 = attempt(
                b,
                hop,
                t,
                outcome="success",
                overlays=frozenset(),
                causation=causation,
                shape=Shape(verify="never"),
            )
            # the receipt was lost on its way back: the sender sends the same key again,
            # and the receiver runs it a second time instead of answering from its record
            res = attempt(
                b,
                hop,
                a1.end_ns + b.ms(3000),
                outcome="success",
                overlays=frozenset(),
                retry_of=a1.hid,
                label=kind,
                verify_p=verify_p,
                shape=Shape(**feeds),
            )
        elif told is not None:
            res = plan_inferred(b, hop, t, told, causation=causation, verify_p=verify_p)
        else:
            res = attempt(
                b,
                hop,
                t,
                outcome=outcome,
                overlays=overlays - {"bounce"},
                causation=causation,
                label=kind,
                verify_p=verify_p,
                shape=replace(shape_for(b, hop, kind, t), **feeds),
                **common,
            )
            if (
                kind is None
                and res.state == "failed"
                and outcome != "commit_fail"
                and not overlays
                and rng.random() < RETRY_AFTER_FAIL_P
            ):
                # an informed retry: the outcome is known (failed), same key and payload
                res = attempt(
                    b,
                    hop,
                    res.end_ns + b.ms(2000),
                    outcome="success",
                    overlays=frozenset(),
                    retry_of=res.hid,
                    verify_p=verify_p,
                )
        if "idempotency_conflict" in overlays:
            b.add_label(res.hid, "idempotency_conflict")
        end = max(res.end_ns, fan_end)
        if (
            topology == "shared_queue"
            and kind is None
            and res.commit_ns is not None
            and rng.random() < config.rates.replay
        ):
            end = max(end, _replay(b, hop, res, receiver=hop.to_agent))
        t = end + b.ms(2000)  # think time before the next hop
        producer = res if res.commit_ns is not None else None
        b.fence += 1
    if fan_out:
        for h in b.handoffs:
            if h.envelope["from_agent"] == hops[0].from_agent:
                b.add_label(h.handoff_id, "fan_out_all")
    _label_left_behind(b)
    label_budget(b)  # what each plan shows of its deadline, tool budget and ack
    steps = tuple(sorted(b.steps, key=lambda s: s.at_ns))
    return TaskPlan(task_id, tenant, topology, tuple(b.handoffs), steps, len(hops))


def _fan_out(b: Builder, hop: Hop, t: int) -> int:
    """The orchestrator of `hop` also consults every other agent of the fleet at once (each
    a clean agent-as-tool call, at the task's current state version); returns when the
    last one ended."""
    end, version = t, b.version
    for expert in AGENTS:
        if expert in (hop.from_agent, hop.to_agent):
            continue
        ask = Hop(
            hop.from_agent,
            expert,
            "consult",
            AGENTS[expert][0][:1],
            f"what the {expert} knows about task {{n}}",
        )
        res = attempt(
            b,
            ask,
            t + b.ms(50),
            outcome="success",
            overlays=frozenset(),
            shape=Shape(verify="never"),
        )
        end = max(end, res.end_ns)
        b.version = version  # a consult reads the task's state, it does not write it
    return end


def _replay(b: Builder, hop: Hop, res: Result, *, receiver: str) -> int:
    """Minutes later a consumer replays the queue from an older offset and processes the
    committed message again: a command runs a second time, an event is re-applied."""
    at = res.end_ns + b.ms(600_000)
    rh = b.replay(res.hid, at)
    t = b.step(rh, "accept", b.accept_at(rh, at), receiver)
    t = b.step(rh, "start", t + b.ms(30), receiver)
    at = t + b.ms(AGENTS[hop.to_agent][1] * 500)
    t = b.step(
        rh,
        "commit",
        at,
        receiver,
        **b.result(rh, at, True, stale_version=False, stale_fence=False),
    )
    b.relabel(rh, {"command_replayed" if hop.kind == "command" else "replay"})
    return t


def _label_left_behind(b: Builder) -> None:
    """Label each version-2 handoff a consumer that reads only version 1 accepted anyway
    (and the risky field it then ignored)."""
    for h in list(b.handoffs):
        hid = h.handoff_id
        if h.envelope["schema_version"] != 2:
            continue
        for s in b.steps:
            left_behind = 2 not in SUPPORTED_VERSIONS.get(s.actor, (1, 2))
            if s.handoff_id == hid and s.event == "accept" and left_behind:
                b.add_label(hid, "incompatible_accepted")
                if any(f in RISKY_V2_FIELDS for f in h.envelope.get("extra", {})):
                    b.add_label(hid, "risky_field_ignored")
