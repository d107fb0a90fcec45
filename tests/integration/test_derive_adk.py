"""Google ADK, with its built-in OpenTelemetry tracing: a real ADK multi-agent app
(tests/adk/app.py, a scripted model in place of the remote one) runs in ADK's own
virtualenv (scripts/app-venv adk: google-adk pins opentelemetry <= 1.44, the project >= 1.45)
and exports through the real OTLP/HTTP exporter, batched, to a real `handoffs serve`, which
derives the handoffs from ADK's spans.
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

RULE = "adk.transfer_to_agent.handoff"


@pytest.fixture(scope="module")
def adk_python() -> str:
    return app_venv_python("adk")


def test_adk_transfers_become_handoffs(derive_serve, adk_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    traces = run_app(adk_python, "adk", serve.otlp_url)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # bounce: triage -> coder -> triage, both committed; failing: triage -> refunds, failed;
    # named: triage -> coder, committed
    wait_for_funnel(
        serve, window, {"volume": 4, "settled": 4, "accepted": 4, "executed": 3, "committed": 3}
    )
    # coder's transfer back names triage's as its cause, which is never verified
    wait_for_anomalies(serve, window, {"bounce": 1, "consumed_before_verified": 1})
    rows = created_rows(
        serve, start, "trace_id, from_agent, to_agent, attributes['handoff.derived_by']"
    )
    assert rows == [
        (traces["bounce"], "triage", "coder", RULE),
        (traces["bounce"], "coder", "triage", RULE),
        (traces["failing"], "triage", "refunds", RULE),
        (traces["named"], "triage", "coder", RULE),
    ]
    hid, pkg = failed_package(serve, start)
    assert hid.startswith(f"{traces['failing']}/")
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "refunds")
    assert pkg["terminal"]["state"] == "failed"
    assert (
        pkg["transitions"][-1]["attributes"]["handoff.error_code"]
        == "runtimeerror_scripted_model_failure"
    )  # ADK: "<type>: <message>"
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
