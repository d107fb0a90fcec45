"""What senders do without declaring it, planned on one hop (pure: a Builder, no I/O).

Each kind of INFERRED_FAULTS is drawn per intent (`draw_inferred`, at most one) and planned by
`plan_inferred`, which labels the handoff the anomaly kind of the same name should flag
(`blind_resend` is labelled `blind_retry`, the kind it raises):

  blind_resend               the first attempt times out into unknown; a minute later the
                             sender sends the same message again as a new handoff (a new id
                             and key, no retry_of); the first resolves failed only afterwards
  retry_after_final_refusal  the receiver refuses with a final code; the sender tries again
                             (retry_of, or a plain resend) and is refused the same way
  keyless_duplicate_write    a command or shared-queue write without an idempotency key, its
                             receipt lost: the sender writes it again seconds after it went
                             through, and the receiver applies it twice (both commit)
  grant_caller_mismatch      the grant names an agent other than the sender as its caller
  missing_grant              capabilities asked for without any grant
  out_of_order_version       the receiver's accept carries the state version before the one
                             the envelope carried (it read an old snapshot)

Latencies are the planner's (latency_scale 1): the keyless resend lands well inside the
600 s keyless window.
"""

from __future__ import annotations

import random
from typing import Final

from collector import semconv as sc
from handoffs.simulator._attempt import Result, Shape, attempt, impostor
from handoffs.simulator._builder import MS, Builder
from handoffs.simulator._catalog import ACCEPT_MS, AGENTS, DEADLINE_MS, Hop
from handoffs.simulator._model import INFERRED_FAULTS, ScenarioConfig

__all__ = ["FINAL_CODES", "LABEL", "draw_inferred", "plan_inferred", "side_effecting"]

#: the label each drawn kind puts on the handoff its anomaly kind flags
LABEL: Final = {k: ("blind_retry" if k == "blind_resend" else k) for k in INFERRED_FAULTS}
#: the refusals a retry cannot change (collector.semconv marks them final)
FINAL_CODES: Final = ("permission_denied", "capability_not_granted")


def side_effecting(hop: Hop, topology: str) -> bool:
    """A command, or any handoff on the shared queue: a write a duplicate applies twice."""
    return hop.kind == "command" or topology == "shared_queue"


def draw_inferred(cfg: ScenarioConfig, rng: random.Random, hop: Hop, topology: str) -> str | None:
    """At most one kind of INFERRED_FAULTS for an intent; keyless_duplicate_write only on a
    side-effecting hop (a rate per such intent). Draws nothing (no random number) when every
    rate is 0, so plans without them stay as they were."""
    rates = [(k, getattr(cfg.rates, k)) for k in INFERRED_FAULTS]
    if not any(r for _k, r in rates):
        return None
    u, acc = rng.random(), 0.0
    for kind, rate in rates:
        if kind == "keyless_duplicate_write" and not side_effecting(hop, topology):
            continue
        acc += rate
        if u < acc:
            return kind
    return None


def _run(b: Builder, hop: Hop, hid: str, t0: int, *, verify_p: float, **accept: object) -> Result:
    """The receiver accepts (with `accept`'s attributes), starts and commits `hid`; the
    sender reads the receipt back with probability verify_p."""
    deadline_ns = DEADLINE_MS[b.topology] * MS
    run_ns = min(b.ms(AGENTS[hop.to_agent][1] * 1000), int(deadline_ns * 0.7))
    rcv = hop.to_agent
    t = b.step(hid, "accept", b.accept_at(hid, t0), rcv, extra={sc.TENANT: b.tenant}, **accept)
    t = b.step(hid, "start", t + b.ms(30), rcv)
    at = t + run_ns
    t = b.step(hid, "commit", at, rcv, **b.result(hid, at, True, stale_version=False,
                                                     stale_fence=False))  # fmt: skip
    commit_ns, verified = t, False
    if b.rng.random() < verify_p:
        t, verified = b.verify(hid, t + b.ms(1000), hop.from_agent), True
    b.version += 1
    return Result(hid, t, commit_ns, verified, b.state[hid])


def _refuse(b: Builder, hop: Hop, hid: str, t0: int, code: str) -> int:
    return b.step(hid, "reject", t0 + b.ms(ACCEPT_MS[b.topology]), hop.to_agent, error_code=code)


def plan_inferred(
    b: Builder, hop: Hop, t: int, kind: str, *, causation: str | None, verify_p: float
) -> Result:
    """Plan the hop's attempts for `kind` (module doc) from t; the Result of the attempt the
    next hop may consume (None commit when the hop ended refused). ValueError for a kind
    not in INFERRED_FAULTS."""
    if kind not in INFERRED_FAULTS:
        raise ValueError(f"unknown inferred kind {kind!r}; expected one of {INFERRED_FAULTS}")
    label = LABEL[kind]
    if kind == "blind_resend":
        a1 = attempt(b, hop, t, outcome="blind_first", overlays=frozenset(), causation=causation)
        h2 = b.resend(a1.hid, a1.end_ns + b.ms(60_000))
        res = _run(b, hop, h2, b.created_at(h2), verify_p=verify_p)
        b.relabel(h2, {label})
        # the first attempt's outcome is learned only after the resend went through
        b.step(a1.hid, "resolve_failed", res.end_ns + b.ms(5000), hop.to_agent,
               error_code="superseded")  # fmt: skip
        return res
    if kind == "retry_after_final_refusal":
        code = b.rng.choice(FINAL_CODES)
        refused = b.create(hop, t, causation=causation, faults=frozenset({"reject"}))
        end = _refuse(b, hop, refused, t, code)
        at = end + b.ms(2000)
        if b.rng.random() < 0.5:
            h2 = b.create(hop, at, retry_of=refused, faults=frozenset({label, "reject"}))
        else:
            h2 = b.resend(refused, at)
            b.relabel(h2, {label, "reject"})
        end = _refuse(b, hop, h2, at, code)
        return Result(h2, end, None, False, b.state[h2])
    if kind == "keyless_duplicate_write":
        h1 = b.create(hop, t, causation=causation, keyless=True)
        first = _run(b, hop, h1, t, verify_p=0.0)
        h2 = b.resend(h1, first.end_ns + b.ms(2000))
        res = _run(b, hop, h2, b.created_at(h2), verify_p=verify_p)
        b.relabel(h2, {label})
        return res
    if kind == "out_of_order_version":
        h = b.create(hop, t, causation=causation, faults=frozenset({label}))
        return _run(b, hop, h, t, verify_p=verify_p, state_version=b.version - 1)
    grant = b.grant(hop, t, caller=impostor(b, hop)) if kind == "grant_caller_mismatch" else {}
    return attempt(b, hop, t, outcome="success", overlays=frozenset(), causation=causation,
                   label=label, verify_p=verify_p, shape=Shape(grant=grant))  # fmt: skip
