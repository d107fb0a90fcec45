"""Cached loader of the keyless side-effecting writes per agent pair (analytics.keyless), as
in dashboard._data."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

import analytics
from dashboard._data import TTL_S, _call, _window

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["keyless_writes"]


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def keyless_writes(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.keyless_writes: per pair, side-effecting handoffs, keyless, their share,
    duplicates flagged."""
    return _call(
        analytics.keyless_writes, store, database, window=_window(start, end, as_of), tenant=tenant
    )
