"""Metric queries, anomalies, evidence packages and the weekly report (SQL first).

Every loader takes a clickhouse-connect `client` and keyword-only arguments; times are aware
UTC datetimes; `database` defaults to HANDOFFS_DATABASE. Contract: docs/metrics.md.
"""

from typing import TYPE_CHECKING

from foundation.lazy import lazy_exports

# The package face: exported name -> the module that defines it, loaded on first use (PEP 562).
# `handoffs serve` imports analytics._cli's commands to build its parser and must not pay for
# pandas/numpy (about 100 MB RSS) that only the loaders need.
_WHERE = {
    "DIMENSIONS": "analytics._sql.cohort",
    "Window": "analytics._sql.cohort",
    "SettleResult": "analytics._sql.settled",
    "settle": "analytics._sql.settled",
    "ANOMALY_KINDS": "analytics.anomaly_kinds",
    "anomalies": "analytics.anomaly_kinds",
    "anomaly_handoff_ids": "analytics.anomaly_kinds",
    "backfill_task_index": "analytics.anomaly_kinds",
    "blind_spots": "analytics.coverage",
    "VerifyResult": "analytics.evidence.package",
    "evidence_package": "analytics.evidence.package",
    "verify_package": "analytics.evidence.package",
    "keyless_writes": "analytics.keyless",
    "STAGES": "analytics.metrics",
    "find_handoffs": "analytics.metrics",
    "funnel": "analytics.metrics",
    "funnel_windows": "analytics.metrics",
    "handoffs_behind": "analytics.metrics",
    "latencies": "analytics.metrics",
    "task_stats": "analytics.metrics",
    "tenants": "analytics.metrics",
    "weekly_report": "analytics.report",
    "rejection_spikes": "analytics.spikes",
    "sustained_rejections": "analytics.sustained",
    "queue_lag": "analytics.topology",
    "task_fan_out": "analytics.topology",
    "topology_cards": "analytics.topology",
    "unknown_fields": "analytics.topology",
}

lazy_exports(__name__, _WHERE)

__all__ = sorted(_WHERE)

# What type checkers read: they follow imports, not the table above, so `from analytics import
# funnel` is checked against funnel's signature. The same names from the same modules
# (tests/unit/test_package_faces.py holds the two equal). Ruff, which reads only a literal
# __all__, would call them unused:
# ruff: noqa: F401
if TYPE_CHECKING:
    from analytics._sql.cohort import DIMENSIONS, Window
    from analytics._sql.settled import SettleResult, settle
    from analytics.anomaly_kinds import (
        ANOMALY_KINDS,
        anomalies,
        anomaly_handoff_ids,
        backfill_task_index,
    )
    from analytics.coverage import blind_spots
    from analytics.evidence.package import VerifyResult, evidence_package, verify_package
    from analytics.keyless import keyless_writes
    from analytics.metrics import (
        STAGES,
        find_handoffs,
        funnel,
        funnel_windows,
        handoffs_behind,
        latencies,
        task_stats,
        tenants,
    )
    from analytics.report import weekly_report
    from analytics.spikes import rejection_spikes
    from analytics.sustained import sustained_rejections
    from analytics.topology import queue_lag, task_fan_out, topology_cards, unknown_fields
