"""The simulated fleet: agents, their Agent Cards, task templates, topologies, latencies.

Pure data. Latencies are medians (the planner draws log-normally around them); deadlines
are the envelope's `deadline_ms` per topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "ACCEPT_MS",
    "AGENTS",
    "DEADLINE_MS",
    "LEFT_BEHIND",
    "MEAN_INTENTS",
    "RISKY_V2_FIELDS",
    "SCHEMA_V2_FIELDS",
    "SPECIALISTS",
    "SUPPORTED_VERSIONS",
    "TOPOLOGIES",
    "TOPOLOGY_FAULTS",
    "TOPOLOGY_WEIGHTS",
    "WORKFLOWS",
    "WORKFLOW_WEIGHTS",
    "Hop",
]


TOPOLOGIES: Final = ("in_process", "agent_as_tool", "shared_queue", "federated_a2a")
TOPOLOGY_WEIGHTS: Final = (0.3, 0.3, 0.25, 0.15)
#: Median accept latency per topology, ms: a queue waits for a consumer, A2A crosses a network.
ACCEPT_MS: Final = {
    "in_process": 5,
    "agent_as_tool": 80,
    "shared_queue": 1500,
    "federated_a2a": 400,
}
DEADLINE_MS: Final = {
    "in_process": 120_000,
    "agent_as_tool": 180_000,
    "shared_queue": 300_000,
    "federated_a2a": 240_000,
}

#: Agent -> (capabilities on its Agent Card, median run time in seconds).
AGENTS: Final = MappingProxyType(
    {
        "planner": (("plan.decompose",), 4.0),
        "triage": (("triage.route",), 2.0),
        "researcher": (("docs.read", "web.search"), 20.0),
        "coder": (("code.write", "code.test"), 45.0),
        "reviewer": (("code.review",), 15.0),
        "support": (("support.reply",), 10.0),
        "billing": (("billing.refund", "billing.invoice"), 6.0),
        "oncall": (("incident.page",), 90.0),
    }
)
SPECIALISTS: Final = ("researcher", "coder", "reviewer", "support", "billing")

#: Each topology's own injected faults (FAULTS labels): the failures that define it. They
#: are drawn only on intents of that topology, at their rate per intent of the topology
#: (fan_out_all: per task). Everything else is drawn the same way everywhere.
TOPOLOGY_FAULTS: Final = MappingProxyType(
    {
        "in_process": ("bounce", "unfiltered_sensitive_history"),
        "agent_as_tool": ("partial_result", "partial_result_committed", "fan_out_all"),
        "shared_queue": (
            "duplicate_delivery",
            "consumer_lag",
            "command_replayed",
            "consumer_stalled",
        ),
        "federated_a2a": ("after_terminal", "stale_agent_card", "card_skill_refused"),
    }
)
#: The schema-version rollout: a sender already on version 2 adds these envelope fields;
#: every consumer reads versions 1 and 2 except LEFT_BEHIND, still on 1, which accepts a
#: version-2 envelope anyway and ignores the fields it does not know. `amount_limit` is a
#: risky field (it bounds a refund); it travels on half the version-2 envelopes.
SCHEMA_V2_FIELDS: Final = ("priority", "amount_limit")
RISKY_V2_FIELDS: Final = frozenset({"amount_limit"})
LEFT_BEHIND: Final = "billing"
SUPPORTED_VERSIONS: Final = MappingProxyType(
    {agent: (1,) if agent == LEFT_BEHIND else (1, 2) for agent in AGENTS}
)


@dataclass(frozen=True, slots=True)
class Hop:
    from_agent: str
    to_agent: str
    mode: str
    capabilities: tuple[str, ...]
    objective: str
    kind: str = "command"  # handoff.message.kind: command | event | receipt


#: Task templates: (name, weight, hops). Together they use every mode.
WORKFLOWS: Final = (
    (
        "feature",
        0.35,
        (
            Hop(
                "planner",
                "researcher",
                "consult",
                ("docs.read",),
                "summarize the API docs for feature {n}",
            ),
            Hop("planner", "coder", "delegate", ("code.write",), "implement feature {n}"),
            # the patch is posted for review: an event the reviewer picks up
            Hop(
                "coder",
                "reviewer",
                "consult",
                ("code.review",),
                "review the patch for feature {n}",
                "event",
            ),
        ),
    ),
    (
        "bugfix",
        0.2,
        (
            Hop(
                "triage",
                "coder",
                "delegate",
                ("code.write", "code.test"),
                "fix bug {n} and add a test",
            ),
            Hop("coder", "reviewer", "consult", ("code.review",), "review the fix for bug {n}"),
        ),
    ),
    (
        "support",
        0.3,
        (
            Hop("triage", "support", "transfer", ("support.reply",), "answer customer ticket {n}"),
            Hop("support", "billing", "transfer", ("billing.refund",), "refund order {n}"),
        ),
    ),
    (
        "incident",
        0.15,
        (
            Hop(
                "support",
                "oncall",
                "escalate",
                ("incident.page",),
                "customer outage report {n}",
                "event",
            ),
            Hop("oncall", "coder", "delegate", ("code.write",), "hotfix for incident {n}"),
        ),
    ),
)
WORKFLOW_WEIGHTS: Final = tuple(w for _, w, _ in WORKFLOWS)
#: Mean business handoff intents per task, to turn "handoffs/s" into a task rate.
MEAN_INTENTS: Final = sum(w * len(h) for _, w, h in WORKFLOWS) / sum(WORKFLOW_WEIGHTS)
