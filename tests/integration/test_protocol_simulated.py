"""The protocol-audit kinds injected by the simulator are recovered by the analytics.

A seeded backfill (the default failure rates, plus every audit kind at AUDIT_RATE per
intent) goes through the real shim and the real OTLP/HTTP exporter into `handoffs serve`
(subprocess, embedded chDB, three tenants with their own tokens); analytics.anomalies()
then reads it back over serve's ClickHouse HTTP query port.

Tolerance, per kind: the recovered count of handoffs is within 10% (at least 2) of the
handoffs the planner labelled with that kind, and zero where none was injected (the
ordinary traffic around them carries grants, receipts with expiry, read-backs, informed
retries and causation chains, so a kind that fires on those fails). Separately the labelled
count is within 4 binomial standard deviations of AUDIT_RATE x intents.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from analytics import Window, anomalies, anomaly_handoff_ids
from analytics.audit_view import handoff_links
from handoffs.simulator import (
    AUDIT_KINDS,
    Emitter,
    FailureRates,
    ScenarioConfig,
    otlp_exporter_factory,
    run_backfill,
)

S = 10**9
INTENTS = 1500
AUDIT_RATE = 0.03
TOKENS = {"acme": "tok-acme", "globex": "tok-globex", "initech": "tok-initech"}


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / S, tz=UTC)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from serve.testing import start_serve

    serve = start_serve(
        tmp_path_factory.mktemp("protosim"), ",".join(f"{t}={n}" for n, t in TOKENS.items())
    )
    try:
        # a full hour 2 h ago at least: no step is planned in the wall clock's future
        end = (time.time_ns() // (3600 * S)) * 3600 * S - 2 * 3600 * S
        start = end - 86400 * S
        rates = FailureRates.parse(",".join(f"{k}={AUDIT_RATE}" for k in AUDIT_KINDS))
        cfg = ScenarioConfig(seed=31, tenants=dict.fromkeys(TOKENS, 1.0), rates=rates)
        emitter = Emitter(exporter_factory=otlp_exporter_factory(serve.otlp_url), tokens=TOKENS)
        run_backfill(emitter, cfg, start_ns=start, end_ns=end, handoffs=INTENTS, progress=False)
        stats = emitter.close()
        assert stats.export_failed == 0 and stats.exported == stats.spans
        serve.wait_stored(120)
        client = serve.client()
        # the cohort: handoffs created in the window; consumers and retries come minutes
        # after their producer, so the window reaches an hour past the last task start
        w = Window(start=_dt(start), end=_dt(end + 3600 * S), as_of=_dt(end + 3600 * S))
        df = anomalies(client, database=serve.database, window=w, kinds=AUDIT_KINDS)
        yield {
            "stats": stats,
            "got": dict(zip(df["kind"], df["count"], strict=True)),
            "client": client,
            "db": serve.database,
            "window": w,
        }
        client.close()
    finally:
        serve.stop()


@pytest.mark.parametrize("kind", AUDIT_KINDS)
def test_each_injected_kind_is_recovered(simulated, kind):
    stats, got = simulated["stats"], simulated["got"]
    injected = stats.faults.get(kind, 0)
    assert injected > 0, kind
    assert abs(int(got[kind]) - injected) <= max(2, 0.1 * injected), (kind, got[kind], injected)


def test_injected_counts_follow_the_rates(simulated):
    stats = simulated["stats"]
    n = stats.intents
    sd = (AUDIT_RATE * (1 - AUDIT_RATE) / n) ** 0.5
    for kind in AUDIT_KINDS:
        assert abs(stats.faults.get(kind, 0) / n - AUDIT_RATE) < 4 * sd, kind


def _links(sim, hid: str):
    client, db = sim["client"], sim["db"]
    tenant, task, retry_of, cause = client.query(
        f"SELECT tenant, task_id, attributes['handoff.retry_of'], "
        f"attributes['handoff.causation_id'] FROM {db}.handoff_transitions "
        "WHERE handoff_id = {h:String} AND event = 'create'",
        parameters={"h": hid},
    ).result_rows[0]
    links = handoff_links(
        client, database=db, tenant=tenant, handoff_id=hid, task_id=task, named=(retry_of, cause)
    )
    return links, retry_of, cause


def test_the_explorer_links_of_simulated_retries_and_consumers(simulated):
    """What the explorer shows of a blind retry (its unknown first attempt before it) and
    of a consumer (the handoff it consumed upstream, this one among that one's consumers)."""
    ids = {
        kind: anomaly_handoff_ids(
            simulated["client"], database=simulated["db"], window=simulated["window"], kind=kind
        )[:3]
        for kind in ("blind_retry", "duplicate_execution", "consumed_before_verified")
    }
    assert all(ids.values()), ids
    for hid in ids["blind_retry"] + ids["duplicate_execution"]:
        links, retry_of, _ = _links(simulated, hid)
        assert links.previous is not None and links.previous.handoff_id == retry_of
        assert [a.attempt for a in links.attempts] == [1, 2]
        assert links.previous.last_state in ("failed", "committed", "verified")
        first, _, _ = _links(simulated, retry_of)
        assert [n.handoff_id for n in first.next] == [hid]
    for hid in ids["consumed_before_verified"]:
        links, _, cause = _links(simulated, hid)
        assert links.upstream is not None and links.upstream.handoff_id == cause
        up, _, _ = _links(simulated, cause)
        assert hid in [d.handoff_id for d in up.downstream]


def test_no_audit_kind_without_injection(tmp_path_factory):
    """Ordinary traffic only (audit rates 0): every audit kind counts zero."""
    from serve.testing import start_serve

    serve = start_serve(tmp_path_factory.mktemp("protoneg"), "tok-acme=acme")
    try:
        end = (time.time_ns() // (3600 * S)) * 3600 * S - 2 * 3600 * S
        start = end - 6 * 3600 * S
        rates = FailureRates.parse(",".join(f"{k}=0" for k in AUDIT_KINDS))
        cfg = ScenarioConfig(seed=32, tenants={"acme": 1.0}, rates=rates)
        emitter = Emitter(
            exporter_factory=otlp_exporter_factory(serve.otlp_url), tokens={"acme": "tok-acme"}
        )
        run_backfill(emitter, cfg, start_ns=start, end_ns=end, handoffs=400, progress=False)
        stats = emitter.close()
        assert stats.exported == stats.spans
        serve.wait_stored(120)
        client = serve.client()
        w = Window(start=_dt(start), end=_dt(end + 3600 * S), as_of=_dt(end + 3600 * S))
        df = anomalies(client, database=serve.database, window=w, kinds=AUDIT_KINDS)
        client.close()
        assert dict(zip(df["kind"], df["count"], strict=True)) == dict.fromkeys(AUDIT_KINDS, 0)
    finally:
        serve.stop()
