"""Cached loaders of each topology's own view (analytics.topology), as in dashboard._data:
per-topology failure cards, queue consumers' lag, agent-as-tool fan-out per orchestrator."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

import analytics
from dashboard._data import TTL_S, _call, _window

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["queue_lag", "task_fan_out", "topology_cards"]


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def topology_cards(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.topology_cards: (topology, handoffs, kind, flagged, rate) rows."""
    return _call(
        analytics.topology_cards, store, database, window=_window(start, end, as_of), tenant=tenant
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def queue_lag(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.queue_lag: p50/p95/max lag per consumer and queue."""
    return _call(
        analytics.queue_lag, store, database, window=_window(start, end, as_of), tenant=tenant
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def task_fan_out(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.task_fan_out: experts and attempts per task, p50/p95 per orchestrator."""
    return _call(
        analytics.task_fan_out, store, database, window=_window(start, end, as_of), tenant=tenant
    )
