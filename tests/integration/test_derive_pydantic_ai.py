"""Pydantic AI, with its built-in OpenTelemetry instrumentation: a real Pydantic AI app
(tests/pydantic_ai/app.py: triage delegates to billing or refund by a tool that runs the other
agent; a scripted OpenAI-compatible server on loopback in place of the remote model) runs in
its own virtualenv (scripts/app-venv pydantic_ai) and exports through the real OTLP/HTTP
exporter, batched, to a real `handoffs serve`, which derives the delegations.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _derived import anomaly_counts, wait_for_funnel

import analytics

RULE = "pydantic_ai.agent_delegation.handoff"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def app_python() -> str:
    """The app venv's python (built from tests/pydantic_ai/requirements.txt on first use)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), "pydantic_ai"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("version", [5, 3])
def test_pydantic_ai_delegations_become_handoffs(derive_serve, app_python, version):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    ran = subprocess.run(
        [app_python, str(ROOT / "tests" / "pydantic_ai" / "app.py"), serve.otlp_url,
         str(version)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    traces = json.loads(ran.stdout.strip().splitlines()[-1])
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, whose model call failed
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund's delegation back names triage's as its cause, never verified. No clock_skew:
    # each nested run is accepted at its start, its results at its end. No bounce: a
    # delegation returns to its caller, a bounce is a transfer handed straight back
    assert anomaly_counts(serve, window) == {"consumed_before_verified": 1}
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, from_agent, to_agent, mode, topology, "
            "attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        d = ("delegate", "agent_as_tool", RULE)
        assert rows == [
            (traces["billing"], "triage", "billing", *d),
            (traces["refund"], "triage", "refund", *d),
            (traces["bounce"], "triage", "refund", *d),
            (traces["bounce"], "refund", "triage", *d),
            (traces["failing"], "triage", "billing", *d),
        ]
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert hid.startswith(f"{traces['failing']}/")
    events = pkg["transitions"]
    assert [t["event"] for t in events] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    assert events[-1]["attributes"]["handoff.error_code"] == "model_server_error"
    assert {t["attributes"]["handoff.derived_by"] for t in events} == {RULE}
