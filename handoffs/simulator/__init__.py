"""Simulated multi-agent traffic through the real shim and the real OTLP exporter.

The planner (`plan_task`, `backfill_starts`, `live_starts`) is pure: it turns a seed and a
ScenarioConfig into timed steps. The emitter (`Emitter`, `run_backfill`, `run_live`) drives
those steps through collector.HandoffTracer into OpenTelemetry's OTLP/HTTP exporter, one
TracerProvider per tenant with that tenant's bearer token; it never writes to the store.
"""

from handoffs.simulator._arrivals import backfill_starts, live_starts
from handoffs.simulator._catalog import (
    AGENTS,
    LEFT_BEHIND,
    MEAN_INTENTS,
    TOPOLOGIES,
    TOPOLOGY_FAULTS,
    WORKFLOWS,
)
from handoffs.simulator._emit import EmitStats, Emitter, otlp_exporter_factory
from handoffs.simulator._model import (
    AUDIT_KINDS,
    CHAINED_KINDS,
    CLI_AUDIT_RATE,
    CLI_EVIDENCE_RATE,
    EVIDENCE_FAULTS,
    FAULTS,
    INFERRED_FAULTS,
    FailureRates,
    PlannedHandoff,
    ScenarioConfig,
    SimulatorConfigError,
    SkillOutage,
    Step,
    TaskPlan,
)
from handoffs.simulator._parallel import merge_stats, run_backfill_parallel
from handoffs.simulator._run import LIVE_SEQ_BASE, run_backfill, run_live
from handoffs.simulator._scenario import plan_task

__all__ = [
    "AGENTS",
    "AUDIT_KINDS",
    "CHAINED_KINDS",
    "CLI_AUDIT_RATE",
    "CLI_EVIDENCE_RATE",
    "EVIDENCE_FAULTS",
    "FAULTS",
    "INFERRED_FAULTS",
    "LEFT_BEHIND",
    "LIVE_SEQ_BASE",
    "MEAN_INTENTS",
    "TOPOLOGIES",
    "TOPOLOGY_FAULTS",
    "WORKFLOWS",
    "EmitStats",
    "Emitter",
    "FailureRates",
    "PlannedHandoff",
    "ScenarioConfig",
    "SimulatorConfigError",
    "SkillOutage",
    "Step",
    "TaskPlan",
    "backfill_starts",
    "live_starts",
    "merge_stats",
    "otlp_exporter_factory",
    "plan_task",
    "run_backfill",
    "run_backfill_parallel",
    "run_live",
]
