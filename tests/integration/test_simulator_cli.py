"""`handoffs simulate` as a user runs it: backfill (2 worker processes) and live, into a real
serve with per-tenant tokens; a wrong token is reported, not swallowed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TOKENS = "tok-a=acme,tok-b=globex"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("simcli"), TOKENS)
    yield s
    s.stop()


def _simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "handoffs", "simulate", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_backfill_then_live_all_stored_per_tenant(serve):
    r = _simulate("--otlp", serve.otlp_url, "--tokens", TOKENS, "--handoffs", "300", "--days", "1",
                  "--workers", "2", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    back = json.loads(r.stdout)
    assert back["exported"] == back["spans"] > 0 and back["export_failed"] == 0
    assert set(back["tenants"]) == {"acme", "globex"}
    # the ground truth per topology: its tasks, intents, handoffs and its own faults
    by_topology = back["by_topology"]
    assert set(by_topology) == {"in_process", "agent_as_tool", "shared_queue", "federated_a2a"}
    assert sum(t["intents"] for t in by_topology.values()) == back["intents"]
    r = _simulate("--otlp", serve.otlp_url, "--tokens", TOKENS, "--mode", "live", "--rate", "30",
                  "--duration", "3", "--latency-scale", "0.01", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    live = json.loads(r.stdout)
    assert live["exported"] == live["spans"] > 0
    serve.wait_stored(60)
    client = serve.client()
    rows = dict(
        client.query(
            f"SELECT Tenant, count() FROM {serve.database}.otel_traces GROUP BY Tenant"
        ).result_rows
    )
    assert set(rows) == {"acme", "globex"}
    assert sum(rows.values()) == back["spans"] + live["spans"]


def test_wrong_token_is_an_export_failure_with_exit_3(serve):
    r = _simulate(
        "--otlp",
        serve.otlp_url,
        "--tokens",
        "nope=acme",
        "--handoffs",
        "20",
        "--days",
        "1",
        "--workers",
        "1",
    )
    assert r.returncode == 3
    assert "could not be exported" in r.stderr
