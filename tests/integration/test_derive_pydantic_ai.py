"""Pydantic AI, with its built-in OpenTelemetry instrumentation: a real Pydantic AI app
(tests/pydantic_ai/app.py: triage delegates to billing or refund by a tool that runs the other
agent; a scripted OpenAI-compatible server on loopback in place of the remote model) runs in
its own virtualenv (scripts/app-venv pydantic_ai) and exports through the real OTLP/HTTP
exporter, batched, to a real `handoffs serve`, which derives the delegations.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import analytics
from tests.integration._derived import (
    app_venv_python,
    created_rows,
    failed_package,
    run_app,
    wait_for_anomalies,
    wait_for_funnel,
)

RULE = "pydantic_ai.agent_delegation.handoff"


@pytest.fixture(scope="module")
def app_python() -> str:
    return app_venv_python("pydantic_ai")


@pytest.mark.parametrize("version", [5, 3])
def test_pydantic_ai_delegations_become_handoffs(derive_serve, app_python, version):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    traces = run_app(app_python, "pydantic_ai", serve.otlp_url, str(version))
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, whose model call failed
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund's delegation back names triage's as its cause, never verified. No clock_skew:
    # each nested run is accepted at its start, its results at its end. No bounce: a
    # delegation returns to its caller, a bounce is a transfer handed straight back
    wait_for_anomalies(serve, window, {"consumed_before_verified": 1})
    rows = created_rows(
        serve,
        start,
        "trace_id, from_agent, to_agent, mode, topology, attributes['handoff.derived_by']",
    )
    d = ("delegate", "agent_as_tool", RULE)
    assert rows == [
        (traces["billing"], "triage", "billing", *d),
        (traces["refund"], "triage", "refund", *d),
        (traces["bounce"], "triage", "refund", *d),
        (traces["bounce"], "refund", "triage", *d),
        (traces["failing"], "triage", "billing", *d),
    ]
    hid, pkg = failed_package(serve, start)
    assert hid.startswith(f"{traces['failing']}/")
    events = pkg["transitions"]
    assert [t["event"] for t in events] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    assert events[-1]["attributes"]["handoff.error_code"] == "model_server_error"
    assert {t["attributes"]["handoff.derived_by"] for t in events} == {RULE}
