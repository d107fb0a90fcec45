"""Cached loaders: the analytics functions wrapped in st.cache_data, the client in cache_resource.

Cache keys are plain values (store URL, database, ISO times) so they hash cheaply; the
client is looked up inside each loader. TTL_S bounds how stale a number can be (seconds).
Errors surface as StoreUnavailable (the store) or QueryFailed (a query), both with a
message for the user; pages show them through `_ui.guard()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import streamlit as st

import analytics
from analytics.rollup import empty_split
from dashboard._store import StoreTarget, StoreUnavailable, open_client, resolve_target
from foundation import settings

if TYPE_CHECKING:
    import pandas as pd
    from clickhouse_connect.driver.client import Client

__all__ = [
    "REPORT_TTL_S",
    "TTL_S",
    "QueryFailed",
    "Source",
    "anomalies",
    "blind_spots",
    "evidence_package",
    "find_handoffs",
    "funnel",
    "handoff_links",
    "handoffs_behind",
    "latencies",
    "origins",
    "rejection_spikes",
    "rejections",
    "source",
    "sustained_rejections",
    "task_handoffs",
    "task_stats",
    "tenant_split",
    "tenants",
    "verify_package",
    "weekly_report",
]

#: Seconds a loaded result is reused; the overview's auto-refresh cannot be faster than this.
TTL_S = 30
#: Seconds a generated weekly report is reused (a report reads a whole week).
REPORT_TTL_S = 300


class QueryFailed(RuntimeError):
    """A loader failed for a reason other than bad input; message meant for the user."""


@dataclass(frozen=True, slots=True)
class Source:
    """The store the app reads, as plain strings (cache keys) plus the parsed target."""

    store: str
    database: str
    target: StoreTarget


def source() -> Source:
    """The store from HANDOFFS_STORE / HANDOFFS_DATABASE (set by `handoffs dashboard`)."""
    store = settings.resolve(settings.STORE)
    database = settings.resolve(settings.DATABASE)
    target = resolve_target(store, database)
    return Source(store=store, database=target.database, target=target)


@st.cache_resource(show_spinner=False)
def _client(store: str, database: str) -> Client:
    # One client per store for all sessions: the HTTP client pools connections and sends no
    # session id (concurrent queries in one ClickHouse session would be refused).
    return open_client(resolve_target(store, database))


def client(src: Source) -> Client:
    """The shared client for `src`; raises StoreUnavailable with a message for the user."""
    return _client(src.store, src.database)


def _window(start: str, end: str, as_of: str | None) -> analytics.Window:
    return analytics.Window(
        start=datetime.fromisoformat(start),
        end=datetime.fromisoformat(end),
        as_of=datetime.fromisoformat(as_of) if as_of else None,
    )


def _call(fn: Any, store: str, database: str, **kwargs: Any) -> Any:
    c = _client(store, database)
    try:
        return fn(c, database=database, **kwargs)
    except (StoreUnavailable, ValueError):
        raise
    except Exception as exc:  # the store went away or refused the query
        text = " ".join(str(exc).split())[:300]
        raise QueryFailed(f"Could not load {fn.__name__}() from the store: {text}") from exc


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=256)
def funnel(
    store: str,
    database: str,
    start: str,
    end: str,
    as_of: str | None,
    by: tuple[str, ...] = (),
    tenant: str | None = None,
    bucket: str | None = None,
) -> pd.DataFrame:
    """analytics.funnel over [start, end) (ISO UTC); see its docstring for the columns."""
    return _call(
        analytics.funnel,
        store,
        database,
        window=_window(start, end, as_of),
        by=by,
        tenant=tenant,
        bucket=bucket,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def tenant_split(
    store: str, database: str, start: str, end: str, as_of: str | None, bucket: str | None = None
) -> pd.DataFrame:
    """funnel(by=("tenant",), bucket=...) for all tenants, the Overview's one query per period:
    roll it up with analytics.rollup. An empty window gives an empty frame, not an error."""
    try:
        return funnel(store, database, start, end, as_of, by=("tenant",), bucket=bucket)
    except QueryFailed:
        # analytics may fail to shape an empty grouped result; tell "empty" from "broken"
        total = funnel(store, database, start, end, as_of)
        if len(total) and int(total["volume"].sum()):
            raise
        return empty_split(("tenant", "bucket") if bucket else ("tenant",))


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def tenants(store: str, database: str, start: str, end: str) -> list[str]:
    """analytics.tenants: the tenant picker's list (one cheap read, no funnel)."""
    return _call(analytics.tenants, store, database, window=_window(start, end, None))


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def latencies(
    store: str,
    database: str,
    start: str,
    end: str,
    as_of: str | None,
    by: tuple[str, ...] = (),
    tenant: str | None = None,
) -> pd.DataFrame:
    """analytics.latencies (milliseconds)."""
    return _call(
        analytics.latencies,
        store,
        database,
        window=_window(start, end, as_of),
        by=by,
        tenant=tenant,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def task_stats(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> dict:
    """analytics.task_stats."""
    return _call(
        analytics.task_stats, store, database, window=_window(start, end, as_of), tenant=tenant
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=128)
def anomalies(
    store: str,
    database: str,
    start: str,
    end: str,
    as_of: str | None,
    tenant: str | None = None,
    examples: int = 5,
) -> pd.DataFrame:
    """analytics.anomalies: one row per kind (count 0 included)."""
    return _call(
        analytics.anomalies,
        store,
        database,
        window=_window(start, end, as_of),
        tenant=tenant,
        examples=examples,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def rejection_spikes(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.rejection_spikes: the hours and groups whose rejection rate spiked."""
    return _call(
        analytics.rejection_spikes,
        store,
        database,
        window=_window(start, end, as_of),
        tenant=tenant,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def sustained_rejections(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.sustained_rejections: the runs of hours whose rejection rate stayed high."""
    return _call(
        analytics.sustained_rejections,
        store,
        database,
        window=_window(start, end, as_of),
        tenant=tenant,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=128)
def handoffs_behind(
    store: str,
    database: str,
    start: str,
    end: str,
    as_of: str | None,
    stage: str = "settled",
    tenant: str | None = None,
    filters: tuple[tuple[str, str], ...] = (),
    anomaly: str | None = None,
    limit: int = 200,
) -> pd.DataFrame:
    """analytics.handoffs_behind; `filters` as sorted (dimension, value) pairs."""
    return _call(
        analytics.handoffs_behind,
        store,
        database,
        window=_window(start, end, as_of),
        stage=stage,
        tenant=tenant,
        filters=dict(filters) or None,
        anomaly=anomaly,
        limit=limit,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def find_handoffs(store: str, database: str, query: str, limit: int = 50) -> pd.DataFrame:
    """analytics.find_handoffs: by handoff_id, task_id or idempotency key."""
    return _call(analytics.find_handoffs, store, database, query=query, limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def search_handoffs(store: str, database: str, query: str, limit: int = 50) -> pd.DataFrame:
    """analytics.search.search_handoffs: by handoff id, task id, agent or idempotency key."""
    from analytics.search import search_handoffs as load

    return _call(load, store, database, query=query, limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def task_handoffs(store: str, database: str, tenant: str, task_id: str) -> pd.DataFrame:
    """analytics.graph.task_handoffs: one task's handoffs with their causation ids."""
    from analytics.graph import task_handoffs as load

    return _call(load, store, database, tenant=tenant, task_id=task_id)


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def handoff_links(
    store: str, database: str, tenant: str, handoff_id: str, task_id: str, named: tuple[str, ...]
) -> Any:
    """analytics.audit_view.handoff_links: the retry chain and causation links of a handoff."""
    from analytics.audit_view import handoff_links as load

    return _call(
        load, store, database, tenant=tenant, handoff_id=handoff_id, task_id=task_id, named=named
    )


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def rejections(
    store: str,
    database: str,
    start: str,
    end: str,
    as_of: str | None,
    tenant: str | None = None,
    examples: int = 3,
) -> list[dict[str, Any]] | None:
    """analytics.rejections.rejections as dicts (error_code, count, share_of_rejections,
    share_of_settled, examples), biggest first; None when this analytics has no such module."""
    try:
        from analytics.rejections import rejections as load
    except ImportError:
        return None
    from dataclasses import asdict

    rows = _call(
        load,
        store,
        database,
        window=_window(start, end, as_of),
        tenant=tenant,
        examples=examples,
    )
    return [asdict(r) for r in rows]


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def origins(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> pd.DataFrame:
    """analytics.origin.funnel_by_origin over [start, end): the funnel per origin (shim,
    adapter:<name>, derived:<rule>)."""
    from analytics.origin import funnel_by_origin

    return _call(funnel_by_origin, store, database, window=_window(start, end, as_of),
                 tenant=tenant)  # fmt: skip


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def blind_spots(
    store: str, database: str, start: str, end: str, as_of: str | None, tenant: str | None = None
) -> list[dict[str, Any]]:
    """analytics.coverage.blind_spots over [start, end) (traces by first span start) as dicts
    (tenant, scope, traces, examples, agents, last_seen), per tenant biggest first."""
    from dataclasses import asdict

    from analytics.coverage import blind_spots as load

    found = _call(load, store, database, window=_window(start, end, as_of), tenant=tenant)
    return [asdict(b) for b in found]


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=64)
def evidence_package(store: str, database: str, handoff_id: str) -> dict | None:
    """analytics.evidence_package, or None when the handoff does not exist."""
    return _call(analytics.evidence_package, store, database, handoff_id=handoff_id)


def verify_package(src: Source, package: dict) -> analytics.VerifyResult:
    """analytics.verify_package, never cached: an integrity check must look at the store now."""
    c = client(src)
    try:
        return analytics.verify_package(c, package, database=src.database)
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise QueryFailed(f"The integrity check could not run: {text}") from exc


@st.cache_data(ttl=REPORT_TTL_S, show_spinner=False, max_entries=32)
def weekly_report(store: str, database: str, week: str, fmt: str) -> str:
    """analytics.weekly_report for an ISO week ("2026-W48"), as HTML or Markdown text."""
    return _call(analytics.weekly_report, store, database, week=week, fmt=fmt)
