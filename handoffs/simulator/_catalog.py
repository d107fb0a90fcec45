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
    "MEAN_INTENTS",
    "SPECIALISTS",
    "TOPOLOGIES",
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


@dataclass(frozen=True, slots=True)
class Hop:
    from_agent: str
    to_agent: str
    mode: str
    capabilities: tuple[str, ...]
    objective: str


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
            Hop(
                "coder", "reviewer", "consult", ("code.review",), "review the patch for feature {n}"
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
            Hop("support", "oncall", "escalate", ("incident.page",), "customer outage report {n}"),
            Hop("oncall", "coder", "delegate", ("code.write",), "hotfix for incident {n}"),
        ),
    ),
)
WORKFLOW_WEIGHTS: Final = tuple(w for _, w, _ in WORKFLOWS)
#: Mean business handoff intents per task, to turn "handoffs/s" into a task rate.
MEAN_INTENTS: Final = sum(w * len(h) for _, w, h in WORKFLOWS) / sum(WORKFLOW_WEIGHTS)
