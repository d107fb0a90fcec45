"""Hypothesis strategies of what senders do without declaring it, for the SQL-vs-reference
property (test_metrics_property.py): attempts retried by retry_of, by inference (the same
task, agents and objective hash) or near it, after final, retryable or unlisted rejection
codes and around unknown periods; keyless writes of one payload around the 600 s window;
grants with their caller set to the sender, to someone else, or without a caller; state
versions on creates and receiver events of one task, ties in time included.

Times are whole or half seconds from a start drawn around the window [T0, T0 + 1 h) and
as_of, so some groups start before the window (not in the cohort) and some after others.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from tests.analytics_seed import T, create

__all__ = ["inferred_groups"]

OH = "handoff.objective.hash"
#: final codes, retryable ones, and one outside the vocabulary (not final)
CODES = {
    "final": ("permission_denied", "unknown_capability"),
    "retryable": ("busy", "timeout"),
    "other": ("policy",),
}


def _clock(t0: datetime):
    return lambda s: t0 + timedelta(seconds=s)


@st.composite
def retried(draw, tenant: str, as_of: datetime, k: int, unknown: bool) -> list[T]:
    """Attempt A (rejected with a final, retryable or unlisted code, sometimes flagged
    valid=false; or, with `unknown`, timed out into unknown, resolved or not, or committed),
    a plain resend B (no retry_of, same task, agents, objective): at the time of A's
    refusal, or at a time around A's unknown period; then (after a refusal always, after
    an unknown maybe) a second attempt linked to A by retry_of, inferred, or a near miss
    (another objective, target or sender, no objective, retry_of naming another handoff)."""
    at = _clock(as_of - timedelta(seconds=draw(st.sampled_from([120, 900, 2400]))))
    task, a = f"task-i{k}", f"ia{k}"
    base: dict[str, Any] = {
        "task_id": task,
        "from_agent": "planner",
        "to_agent": "worker",
        "tenant": tenant,
    }
    key_a = draw(st.sampled_from([None, "ki1"]))
    objective: dict[str, Any] = {OH: "obj-1"}
    out = [create(a, at(0), idempotency_key=key_a, **base, **objective)]
    fates = ["unknown", "unknown", "committed"] if unknown else ["final", "retryable", "other"]
    fate = draw(st.sampled_from(fates))
    if fate in CODES:
        attrs: dict = {"handoff.error_code": draw(st.sampled_from(CODES[fate]))}
        if draw(st.integers(0, 5)) == 0:
            attrs["handoff.valid"] = False
        out.append(T(a, "reject", "created", "rejected", at(2), task_id=task, actor="worker",
                     tenant=tenant, attrs=attrs))  # fmt: skip
    else:
        mine: dict[str, Any] = {"task_id": task, "tenant": tenant}
        out += [T(a, "accept", "created", "accepted", at(1), actor="worker", **mine),
                T(a, "start", "accepted", "running", at(2), actor="worker", **mine)]  # fmt: skip
        if fate == "committed":
            out.append(T(a, "commit", "running", "committed", at(3), actor="worker", **mine))
        else:
            out.append(T(a, "timeout", "running", "unknown", at(3), actor="planner", **mine))
            resolved = draw(st.sampled_from([None, 5, 20]))
            if resolved is not None:
                out.append(T(a, "resolve_failed", "unknown", "failed", at(resolved),
                             actor="worker", **mine))  # fmt: skip
    # a refused A: a resend at the very time of the refusal (not after it), then another
    for j in range(2 if not unknown else draw(st.integers(1, 2))):
        b = f"ib{k}-{j}"
        env = dict(base, idempotency_key=draw(st.sampled_from(["ki2", None, "ki1"])))
        extra: dict = {OH: "obj-1"}
        # the first later attempt is a plain resend, the second any link or near miss
        link = "inferred" if j == 0 else draw(st.sampled_from([
            "retry_of", "objective", "inferred", "target", "sender", "no_objective",
            "retry_other"]))  # fmt: skip
        if link == "retry_of":
            extra["handoff.retry_of"] = a
            extra[OH] = draw(st.sampled_from(["obj-1", "obj-2"]))
            env["task_id"] = draw(st.sampled_from([task, f"task-j{k}"]))
        elif link == "objective":
            extra[OH] = "obj-2"
        elif link == "target":
            env["to_agent"] = "coder"
        elif link == "sender":
            env["from_agent"] = "orch"
        elif link == "no_objective":
            del extra[OH]
        elif link == "retry_other":
            extra["handoff.retry_of"] = f"ib{k}-{1 - j}"
        # at A's refusal (2: not after it), its unknown entry (3) or resolution (5), around
        d = 2 if j == 0 and not unknown else draw(st.sampled_from([10, 4, 3, 2.5, 5, 2, 1, 30]))
        out.append(create(b, at(d), **env, **extra))
        if draw(st.booleans()):
            code = draw(st.sampled_from([*CODES["final"], *CODES["retryable"]]))
            out.append(T(b, "reject", "created", "rejected", at(d + 1), task_id=env["task_id"],
                         actor="worker", tenant=tenant, attrs={"handoff.error_code": code}))  # fmt: skip
    return out


@st.composite
def keyless_writes(draw, tenant: str, as_of: datetime, k: int) -> list[T]:
    """Two or three writes, gaps around the 600 s keyless window: keyless commands or
    shared-queue handoffs of one payload to one agent, each the same or off by one thing
    (another payload, none, a key, an event, unmarked in process, another agent, failed)."""
    at = _clock(as_of - timedelta(seconds=draw(st.sampled_from([700, 1500, 3000]))))
    queue = draw(st.booleans())
    out: list[T] = []
    t = 0.0
    for j in range(draw(st.integers(2, 3))):
        t += draw(st.sampled_from([30, 600, 601, 0, 599])) if j else 0
        h = f"kw{k}-{j}"
        env: dict = {"task_id": f"task-kw{k}-{j}", "to_agent": "store", "tenant": tenant,
                     "payload_hash": "sha256:aa",
                     "topology": "shared_queue" if queue else "in_process"}  # fmt: skip
        kind: str | None = None if queue else "command"
        off = draw(st.sampled_from(["same", "same", "payload", "no_payload", "keyed", "event",
                                    "unmarked", "agent", "failed"]))  # fmt: skip
        if off == "payload":
            env["payload_hash"] = "sha256:bb"
        elif off == "no_payload":
            del env["payload_hash"]
        elif off == "keyed":
            env["idempotency_key"] = f"kk{j}"
        elif off == "event":
            kind = "event"
            env["topology"] = "in_process"
        elif off == "unmarked":
            kind = None
            env["topology"] = "in_process"
        elif off == "agent":
            env["to_agent"] = "other"
        if kind is not None:
            env["handoff.message.kind"] = kind
        out.append(create(h, at(t), **env))
        mine: dict[str, Any] = {
            "task_id": env["task_id"],
            "actor": env["to_agent"],
            "tenant": tenant,
        }
        out += [T(h, "accept", "created", "accepted", at(t + 1), **mine),
                T(h, "start", "accepted", "running", at(t + 2), **mine)]  # fmt: skip
        end, state = ("fail", "failed") if off == "failed" else ("commit", "committed")
        out.append(T(h, end, "running", state, at(t + draw(st.sampled_from([3, 700]))), **mine))
    return out


@st.composite
def enveloped(draw, tenant: str, as_of: datetime, k: int) -> list[T]:
    """One to three handoffs of one task: capabilities or none; no grant, a grant whose
    caller is the sender or someone else, or a grant with a subject or capabilities only;
    state versions on the create and on receiver events, times tied or apart."""
    at = _clock(as_of - timedelta(seconds=draw(st.sampled_from([60, 900]))))
    task, out = f"task-v{k}", []
    for j in range(draw(st.integers(1, 3))):
        h = f"ev{k}-{j}"
        src = draw(st.sampled_from(["planner", "orch"]))
        env: dict = {"task_id": task, "from_agent": src, "tenant": tenant,
                     "capabilities": draw(st.sampled_from([[], ["search"]]))}  # fmt: skip
        grant = draw(st.sampled_from(["none", "self", "other", "subject", "capabilities"]))
        if grant == "self":
            env["handoff.grant.caller"] = src
        elif grant == "other":
            env["handoff.grant.caller"] = "mallory"
        elif grant == "subject":
            env["handoff.grant.subject"] = "user:7"
        elif grant == "capabilities":
            env["handoff.grant.capabilities"] = ["search"]
        version = draw(st.sampled_from([None, 3, 8, 10]))
        if version is not None:
            env["handoff.state_version"] = version
        t = draw(st.sampled_from([0, 0, 2, 4]))
        out.append(create(h, at(t), **env))
        for i, (f, e, to) in enumerate((("created", "accept", "accepted"),
                                        ("accepted", "start", "running"))):  # fmt: skip
            v = draw(st.sampled_from([None, 3, 8, 10]))
            attrs = {} if v is None else {"handoff.state_version": v}
            out.append(T(h, e, f, to, at(t + draw(st.sampled_from([0, 1, 3])) + i), task_id=task,
                         actor="worker", tenant=tenant, attrs=attrs))  # fmt: skip
    return out


@st.composite
def inferred_groups(draw, tenant: str, as_of: datetime) -> list[T]:
    """Two retried groups (one refused, one unknown), two keyless groups, one or two
    enveloped groups."""
    rows: list[T] = []
    for k in range(2):
        rows += draw(retried(tenant, as_of, k, unknown=k == 1))
    for k in range(2):
        rows += draw(keyless_writes(tenant, as_of, k))
    for k in range(draw(st.integers(1, 2))):
        rows += draw(enveloped(tenant, as_of, k))
    return rows
