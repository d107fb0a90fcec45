"""Strands Agents, with its built-in OpenTelemetry tracing: a real Strands swarm
(tests/strands/app.py: triage, billing and refund handing off by the swarm's
`handoff_to_agent` tool; a scripted OpenAI-compatible server on loopback in place of the
remote model) runs in its own virtualenv (scripts/app-venv strands) and exports through the
real OTLP/HTTP exporter, batched, to a real `handoffs serve`, which derives the handoffs.
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

RULE = "strands.handoff_to_agent.handoff"


@pytest.fixture(scope="module")
def app_python() -> str:
    return app_venv_python("strands")


# default: the target only in the tool span's gen_ai.tool.message event;
# latest: in gen_ai.tool.call.arguments (OTEL_SEMCONV_STABILITY_OPT_IN)
@pytest.mark.parametrize("conventions", ["default", "latest"])
def test_strands_handoffs_become_handoffs(derive_serve, app_python, conventions):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    extra = ["latest"] if conventions == "latest" else []
    traces = run_app(app_python, "strands", serve.otlp_url, *extra)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, whose model call failed (the swarm's span stays Unset)
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund handed straight back (a bounce), naming triage's handoff as its cause
    wait_for_anomalies(serve, window, {"bounce": 1, "consumed_before_verified": 1})
    rows = created_rows(
        serve, start, "trace_id, from_agent, to_agent, mode, attributes['handoff.derived_by']"
    )
    assert rows == [
        (traces["billing"], "triage", "billing", "transfer", RULE),
        (traces["refund"], "triage", "refund", "transfer", RULE),
        (traces["bounce"], "triage", "refund", "transfer", RULE),
        (traces["bounce"], "refund", "triage", "transfer", RULE),
        (traces["failing"], "triage", "billing", "transfer", RULE),
    ]
    hid, pkg = failed_package(serve, start)
    assert hid.startswith(f"{traces['failing']}/")
    events = pkg["transitions"]
    assert [t["event"] for t in events] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    assert events[-1]["attributes"]["handoff.error_code"] == "internal_server_error"
    assert {t["attributes"]["handoff.derived_by"] for t in events} == {RULE}
