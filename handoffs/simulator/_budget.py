"""The envelope's promises in simulated traffic: deadlines, tool budgets, acknowledgements.

Every envelope carries a message id; a message between processes (shared queue, federated
A2A) also asks to be acknowledged within ACK_TTL_S, and a queued one names where its payload
is kept. Every result reports the tool calls used (within the envelope's max_tool_calls).
Three faults break the promises, each a FailureRates rate per intent:
  deadline_overrun      the work runs past the deadline: committed DEADLINE_LATE_NS after it
  tool_budget_exceeded  the results report a few tool calls more than the budget
  ack_missing           a message asking for an ack within SHORT_TTL_S is accepted
                        ACK_LATE_NS after that
Ordinary traffic breaks them too (a timeout resolved after the deadline, an expired message
never acknowledged), so the labels are not the draws: `label_budget` recomputes them for
every planned handoff from its envelope and planned steps, by the rules of docs/metrics.md.

Pure, no I/O. Message fields and tool calls come from the handoff id, not the task's random
stream, and a rate of 0 draws nothing: traffic planned without these faults is the same
draw for draw.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from collector.contract import TERMINAL, next_state
from handoffs.simulator._model import BUDGET_FAULTS

if TYPE_CHECKING:
    from handoffs.simulator._model import FailureRates, PlannedHandoff, Step

__all__ = [
    "ACK_LATE_NS",
    "ACK_TTL_S",
    "DEADLINE_LATE_NS",
    "SHORT_TTL_S",
    "budget_labels",
    "draw_budget",
    "label_budget",
    "late_ack_ns",
    "message_fields",
    "overrun_run_ns",
    "tool_calls",
]

_S: Final = 1_000_000_000
#: the ack window of an ordinary message, s: past the longest consumer lag (240 s)
ACK_TTL_S: Final = 300
#: the ack window of an ack_missing attempt, s, and how long after it the accept comes
SHORT_TTL_S: Final = 10
ACK_LATE_NS: Final = 5 * _S
#: how long after the deadline a deadline_overrun attempt commits
DEADLINE_LATE_NS: Final = 30 * _S
#: topologies whose handoffs travel as messages between processes (they ask for an ack)
MESSAGE_TOPOLOGIES: Final = frozenset({"shared_queue", "federated_a2a"})
#: the first terminal states that end the receiver's work (docs/metrics.md)
_OUTCOMES: Final = frozenset({"committed", "failed", "rejected"})
_ACKS: Final = frozenset({"accept", "reject"})
_RESULTS: Final = frozenset({"prepare", "commit", "resolve_committed"})


def _h(hid: str) -> int:
    return int(hashlib.sha256(hid.encode()).hexdigest()[:8], 16)


def message_fields(topology: str, hid: str, traits: Iterable[str]) -> dict[str, Any]:
    """The message fields of a new envelope (Envelope keyword arguments): a message id
    always; a message between processes asks for an ack within ACK_TTL_S (a queued one
    also names its payload's place); an ack_missing attempt within SHORT_TTL_S."""
    out: dict[str, Any] = {"message_id": f"msg-{hid}"}
    if topology in MESSAGE_TOPOLOGIES:
        out.update(requires_ack=True, ttl_s=ACK_TTL_S)
        if topology == "shared_queue":
            out["payload_ref"] = f"blob://payloads/{hid}"
    if "ack_missing" in traits:
        out.update(requires_ack=True, ttl_s=SHORT_TTL_S)
    return out


def tool_calls(budget: int | None, hid: str, *, over: bool) -> int:
    """The tool calls a handoff's results report (the same on each: a running total with
    no call between them): 1..budget (0 with a budget of 0; 1..40 without one), or 1 to 3
    above the budget when `over`."""
    h = _h(hid)
    if budget is None:
        return 1 + h % 40
    if over:
        return budget + 1 + h % 3
    return 1 + h % budget if budget > 0 else 0


def late_ack_ns(traits: Iterable[str], envelope: Mapping[str, Any], created_ns: int) -> int | None:
    """When an ack_missing attempt's receiver accepts: ACK_LATE_NS past its ttl; None for
    any other attempt."""
    if "ack_missing" not in traits:
        return None
    return created_ns + int(envelope.get("ttl_s") or SHORT_TTL_S) * _S + ACK_LATE_NS


def overrun_run_ns(deadline_ns: int) -> int:
    """How long a deadline_overrun attempt runs: past its whole deadline."""
    return deadline_ns + DEADLINE_LATE_NS


def draw_budget(rng: random.Random, rates: FailureRates) -> frozenset[str]:
    """The budget faults drawn on an intent (each independently at its rate); a rate of 0
    draws nothing from `rng`."""
    return frozenset(
        name for name in BUDGET_FAULTS if (rate := getattr(rates, name)) > 0 and rng.random() < rate
    )


def budget_labels(envelope: Mapping[str, Any], steps: Iterable[Step]) -> set[str]:
    """The budget kinds one planned handoff shows (its `create` step and transitions, in
    planned order; redeliveries and deliberately illegal steps change no state): the
    envelope's deadline against the first terminal state's time when that is committed,
    failed or rejected; a result reporting more tool calls than max_tool_calls; an ack
    asked for and the first accept or reject later than ttl_s, or none (judged after
    ttl_s has passed)."""
    state: str | None = None
    created: int | None = None
    first_terminal: tuple[str, int] | None = None
    ack: int | None = None
    used: list[int] = []
    for s in steps:
        if s.event == "redeliver" or s.illegal:
            continue
        state = str(next_state(state, s.event))
        if s.event == "create":
            created = s.at_ns
        if s.event in _ACKS and ack is None:
            ack = s.at_ns
        if s.event in _RESULTS and s.attrs.get("tool_calls") is not None:
            used.append(int(s.attrs["tool_calls"]))
        if first_terminal is None and state in TERMINAL:
            first_terminal = (state, s.at_ns)
    if created is None:
        return set()
    out: set[str] = set()
    deadline = envelope.get("deadline_ms")
    if (
        deadline is not None
        and first_terminal is not None
        and first_terminal[0] in _OUTCOMES
        and first_terminal[1] - created > int(deadline) * 1_000_000
    ):
        out.add("deadline_overrun")
    budget = envelope.get("max_tool_calls")
    if budget is not None and used and max(used) > int(budget):
        out.add("tool_budget_exceeded")
    ttl = envelope.get("ttl_s")
    if (
        envelope.get("requires_ack")
        and ttl is not None
        and (ack is None or ack - created > int(ttl) * _S)
    ):
        out.add("ack_missing")
    return out


class Plan(Protocol):
    """What label_budget reads and relabels: a handoffs.simulator._builder.Builder (not
    imported: the builder imports this module)."""

    handoffs: list[PlannedHandoff]
    steps: list[Step]

    def relabel(self, hid: str, labels: set[str] | frozenset[str]) -> None: ...


def label_budget(b: Plan) -> None:
    """Replace the budget labels of every handoff the builder planned with what its steps
    show (budget_labels): a drawn fault whose attempt took another way is not labelled, an
    ordinary handoff that overran is."""
    by: dict[str, list[Step]] = {}
    for s in b.steps:
        by.setdefault(s.handoff_id, []).append(s)
    for h in list(b.handoffs):
        labels = budget_labels(h.envelope, by.get(h.handoff_id, ()))
        faults = (h.faults - set(BUDGET_FAULTS)) | labels
        if faults != h.faults:
            b.relabel(h.handoff_id, faults)
