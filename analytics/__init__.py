"""Metric queries, anomalies, evidence packages and the weekly report (SQL first)."""

__all__: list[str] = []
