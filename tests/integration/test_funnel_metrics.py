"""The handoff funnel on a real serve's GET /metrics: spans POSTed over OTLP/HTTP, the page
parsed with prometheus-client's own parser, the numbers checked against a hand-computed
fixture and against analytics' funnel() and anomalies() over serve's query port; the series
count stays bounded with over a thousand agent pairs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from analytics import Window, anomalies, funnel
from analytics.counts import anomaly_counts, funnel_by_age
from analytics.stages import FUNNEL
from ingest.testing import request_protobuf, span_json, transition
from serve._funnel_metrics import OTHER, STAGES, WINDOWS
from serve.testing import start_serve

TOKENS = "tok-acme=acme,tok-beta=beta,tok-bulk=bulk"
TOP = 1
BULK_PAIRS = 1200
EV = {"handoff__evidence__count": 1, "handoff__evidence__valid": True}
NO_EV = {"handoff__evidence__count": 0, "handoff__evidence__valid": False}


def _spans(paths: dict[str, tuple[str, str, list[tuple[str, str, str, dict]], dict]], t0: int):
    """OTLP spans of each handoff: create (from, to, create attributes) then its steps, one
    second apart from t0 (ns)."""
    out = []
    for n, (h, (frm, to, steps, create_kw)) in enumerate(paths.items()):
        attrs = [
            transition(
                h,
                "create",
                "",
                "created",
                handoff__from_agent=frm,
                handoff__to_agent=to,
                **create_kw,
            ),
            *(transition(h, ev, a, b, **kw) for ev, a, b, kw in steps),
        ]
        for i, a in enumerate(attrs):
            out.append(
                span_json(
                    trace_id=f"{n + 1:032x}",
                    span_id=f"{n + 1:08x}{i + 1:08x}",
                    attributes=a,
                    start_ns=t0 + i * 1_000_000_000,
                )
            )
    return out


#: (event, from_state, to_state, attributes) of one transition
Step = tuple[str, str, str, dict[str, Any]]
ACC: Step = ("accept", "created", "accepted", {})
START: Step = ("start", "accepted", "running", {})
#: tenant acme: pair a->b (h1 committed with evidence, h2 rejected, h5 in flight), pair a->c
#: (h3 timed out into unknown, h4 escalated); tenant beta: x->y (h6 committed, no evidence)
ACME: dict[str, tuple[str, str, list[Step], dict[str, Any]]] = {
    "h1": ("a", "b", [ACC, START, ("commit", "running", "committed", EV)], {}),
    "h2": ("a", "b", [("reject", "created", "rejected", {})], {}),
    "h3": ("a", "c", [ACC, START, ("timeout", "running", "unknown", {})], {}),
    "h4": ("a", "c", [("escalate", "created", "escalated", {})], {}),
    "h5": ("a", "b", [], {"handoff__deadline_ms": 3_600_000}),
}
BETA: dict[str, tuple[str, str, list[Step], dict[str, Any]]] = {
    "h6": ("x", "y", [ACC, START, ("commit", "running", "committed", NO_EV)], {})
}
#: hand-computed: settled, accepted, executed, evidence_claimed, evidenced, committed,
#: unknown, escalated
EXPECTED = {
    ("acme", "a", "b"): (2, 1, 1, 1, 1, 1, 0, 0),
    ("acme", OTHER, OTHER): (2, 1, 0, 0, 0, 0, 1, 1),  # a->c, below the top 1 by volume (2 < 3)
    ("beta", "x", "y"): (1, 1, 1, 0, 0, 0, 0, 0),  # committed, evidence not claimed valid
    ("beta", OTHER, OTHER): (0,) * 8,
}


def _post(serve, token: str, spans: list[dict]) -> None:
    r = requests.post(
        f"{serve.otlp_url}/v1/traces",
        data=request_protobuf(spans),
        headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(
        tmp_path_factory.mktemp("funnel-metrics"),
        TOKENS,
        extra_args=("--metrics-top-pairs", str(TOP), "--metrics-refresh", "0"),
    )
    # created 10 minutes ago: in the 30m..24h cohorts, not the 5m one; past the default
    # deadline + grace (6 min), so h3 is settled in unknown; h5's deadline keeps it in flight
    t0 = time.time_ns() - 600 * 1_000_000_000
    _post(h, "tok-acme", _spans(ACME, t0))
    _post(h, "tok-beta", _spans(BETA, t0))
    bulk: dict[str, tuple[str, str, list[Step], dict[str, Any]]] = {
        f"bulk-{i}": (f"from-{i}", f"to-{i % 7}", [], {}) for i in range(BULK_PAIRS)
    }
    _post(h, "tok-bulk", _spans(bulk, t0))
    h.wait_stored()
    yield h
    assert h.stop() == 0, h.log()


def _scrape(serve) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = requests.get(f"{serve.otlp_url}/metrics", timeout=60)
    assert r.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def _pair_series(m, tenant: str, frm: str, to: str) -> tuple[float, ...]:
    def key(stage: str):
        labels = {"tenant": tenant, "from_agent": frm, "to_agent": to, "stage": stage}
        return ("handoffs_funnel_handoffs", tuple(sorted({**labels, "window": "24h"}.items())))

    return tuple(m[key(s)] for s in STAGES)


def test_funnel_series_carry_the_hand_computed_numbers(serve):
    m = _scrape(serve)
    for (tenant, frm, to), want in EXPECTED.items():
        assert _pair_series(m, tenant, frm, to) == want, (tenant, frm, to)
    cohort = {
        (dict(k)["tenant"], dict(k)["window"], dict(k)["stage"]): v
        for (name, k), v in m.items()
        if name == "handoffs_cohort_handoffs"
    }
    assert {w for _t, w, _s in cohort} == {label for label, _s in WINDOWS}
    # the `stage` label values are the stages analytics.stages marks exported
    assert {s for _t, _w, s in cohort} == {s.name for s in FUNNEL if s.exported}
    for window in ("30m", "1h", "6h", "24h"):
        assert cohort[("acme", window, "settled")] == 4
        assert cohort[("acme", window, "committed")] == 1
        assert cohort[("acme", window, "unknown")] == 1
    assert cohort[("acme", "5m", "settled")] == 0  # created 10 minutes ago
    anomaly = {
        (dict(k)["tenant"], dict(k)["kind"]): v
        for (name, k), v in m.items()
        if name == "handoffs_anomalies"
    }
    assert anomaly[("beta", "committed_without_evidence")] == 1
    assert anomaly[("acme", "committed_without_evidence")] == 0
    assert m[("handoffs_funnel_pairs", (("tenant", "acme"),))] == 2
    assert m[("handoffs_funnel_refresh_errors_total", ())] == 0
    assert m[("handoffs_funnel_last_refresh_timestamp_seconds", ())] > time.time() - 60
    # serve's own receiver metrics are still on the same page
    assert m[("handoffs_stored_spans_total", ())] > 0


def test_series_stay_bounded_with_over_a_thousand_pairs(serve):
    m = _scrape(serve)
    series = [k for k in m if k[0] == "handoffs_funnel_handoffs"]
    tenants = {dict(k[1])["tenant"] for k in series}
    assert tenants == {"acme", "beta", "bulk"}
    assert len(series) <= (TOP + 1) * len(STAGES) * len(tenants)
    assert m[("handoffs_funnel_pairs", (("tenant", "bulk"),))] == BULK_PAIRS
    # the pairs folded into `other` are summed there, not dropped: every bulk handoff is
    # settled (past the default deadline + grace, never accepted)
    settled = [
        v
        for k, v in m.items()
        if k in series and dict(k[1])["tenant"] == "bulk" and dict(k[1])["stage"] == "settled"
    ]
    assert len(settled) == TOP + 1 and sum(settled) == BULK_PAIRS
    key = (("stage", "settled"), ("tenant", "bulk"), ("window", "24h"))
    assert m[("handoffs_cohort_handoffs", key)] == BULK_PAIRS


def test_counts_match_the_analytics_loaders(serve):
    """analytics.counts (pandas-free, what serve runs) gives funnel()'s and anomalies()'
    numbers on the same store and clock."""
    client = serve.client()
    as_of = datetime.now(UTC)
    window = Window(start=as_of - timedelta(hours=24), end=as_of, as_of=as_of)
    stages = tuple(s.name for s in FUNNEL)  # every stage, not only those serve exports
    rows = funnel_by_age(
        client, database=serve.database, as_of=as_of, ages=[timedelta(hours=24)], stages=stages
    )
    df = funnel(
        client, database=serve.database, window=window, by=("tenant", "from_agent", "to_agent")
    )
    want = {
        (r.tenant, r.from_agent, r.to_agent): tuple(int(getattr(r, s)) for s in stages)
        for r in df.itertuples()
    }
    assert {r.keys: r.counts[0] for r in rows} == want
    for tenant in ("acme", "beta"):
        ref = anomalies(client, database=serve.database, window=window, tenant=tenant)
        assert anomaly_counts(client, database=serve.database, window=window, tenant=tenant) == {
            r.kind: int(r.count) for r in ref.itertuples()
        }


def _exported_names(serve) -> set[str]:
    """Every series name GET /metrics declares (a counter also as <name>_total, a histogram
    with its _bucket, _sum and _count), with samples or not yet."""
    r = requests.get(f"{serve.otlp_url}/metrics", timeout=60)
    names = set()
    for fam in text_string_to_metric_families(r.text):
        names.add(fam.name)
        names |= {s.name for s in fam.samples}
        if fam.type == "counter":
            names.add(f"{fam.name}_total")
        if fam.type == "histogram":
            names |= {f"{fam.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names


def test_dashboard_and_alert_queries_use_only_names_serve_exports(serve):
    from tests.unit.test_deploy_monitoring import metric_names, queries, recorded

    exported = _exported_names(serve)
    for where, expr in queries():
        missing = {n for n in metric_names(expr) if n not in exported and n not in recorded()}
        assert not missing, f"{where}: {sorted(missing)} not on serve's /metrics"


def test_reading_the_funnel_keeps_the_dataframe_libraries_out_of_serve(serve):
    """serve refuses to load pandas and friends (serve._tuning); the funnel reads without
    them: a scrape refreshes without an error and nothing of theirs is mapped."""
    from pathlib import Path

    m = _scrape(serve)
    assert m[("handoffs_funnel_refresh_errors_total", ())] == 0
    maps = Path(f"/proc/{serve.process.pid}/maps").read_text()
    assert not [lib for lib in ("/pandas/", "/numpy/", "/pyarrow/", "/polars/") if lib in maps]
