"""LlamaIndex AgentWorkflow, with `openinference-instrumentation-llama-index`: a real
AgentWorkflow app (tests/llamaindex/app.py, a scripted OpenAI-compatible server on loopback in
place of the remote model) runs in its own virtualenv (scripts/app-venv llamaindex) and
exports through the real OTLP/HTTP exporter, batched, to a real `handoffs serve`, which
derives the handoffs by the LlamaIndex dialect table (derive/dialects.py).

No span attribute names an agent: the source and the target's run are read from the
`current_agent_name='...'` in the workflow steps' inputs.
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

RULE = "openinference.llama_index.handoff"


@pytest.fixture(scope="module")
def app_python() -> str:
    return app_venv_python("llamaindex")


def test_llamaindex_handoffs_become_handoffs(derive_serve, app_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    traces = run_app(app_python, "llamaindex", serve.otlp_url)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing and refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, billing's model call fails
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund's handoff back names triage's as its cause, which is never verified
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
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    # the model client's exception type (HTTP 500 from the scripted server)
    assert pkg["transitions"][-1]["attributes"]["handoff.error_code"] == "internalservererror"
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
