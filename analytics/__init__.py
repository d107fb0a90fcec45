"""Metric queries, anomalies, evidence packages and the weekly report (SQL first).

Every loader takes a clickhouse-connect `client` and keyword-only arguments; times are aware
UTC datetimes; `database` defaults to HANDOFFS_DATABASE. Contract: docs/metrics.md.
"""

from analytics._common import DIMENSIONS, Window
from analytics.anomalies import ANOMALY_KINDS, anomalies, anomaly_handoff_ids
from analytics.evidence import VerifyResult, evidence_package, verify_package
from analytics.metrics import (
    STAGES,
    find_handoffs,
    funnel,
    handoffs_behind,
    latencies,
    task_stats,
)
from analytics.report import weekly_report

__all__ = [
    "ANOMALY_KINDS",
    "DIMENSIONS",
    "STAGES",
    "VerifyResult",
    "Window",
    "anomalies",
    "anomaly_handoff_ids",
    "evidence_package",
    "find_handoffs",
    "funnel",
    "handoffs_behind",
    "latencies",
    "task_stats",
    "verify_package",
    "weekly_report",
]
