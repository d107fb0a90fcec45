"""CrewAI, with `openinference-instrumentation-crewai`: a real crew (tests/crewai/app.py,
a scripted OpenAI-compatible server on loopback in place of the remote model) runs in its own
virtualenv (scripts/app-venv crewai) and exports through the real OTLP/HTTP exporter,
batched, to a real `handoffs serve`, which derives the delegations by the CrewAI dialect
table (derive/dialects.py).

What CrewAI shows: the delegation tool span (source = the task span's role, target = the
coworker named in its input) and its output. The coworker's run has no span, and its failure
is the tool's output, status OK. CrewAI cannot hand straight back (a delegated task runs
without delegation tools) and a delegation is no transfer, so no bounce is ever flagged: the
`bounce` crew's way back is a later task's delegation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import analytics
from tests.integration._derived import (
    anomaly_counts,
    app_venv_python,
    created_rows,
    failed_package,
    run_app,
    wait_for_funnel,
)

RULE = "openinference.crewai.delegation"


@pytest.fixture(scope="module")
def app_python() -> str:
    return app_venv_python("crewai")


def test_crewai_delegations_become_handoffs(derive_serve, app_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    traces = run_app(app_python, "crewai", serve.otlp_url)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund (a question), bounce (two delegations): committed; failing: failed
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    assert "bounce" not in anomaly_counts(serve, window)  # delegations, not transfers
    rows = created_rows(
        serve, start, "trace_id, from_agent, to_agent, mode, attributes['handoff.derived_by']"
    )
    assert rows == [
        (traces["billing"], "Triage", "Billing", "delegate", RULE),
        (traces["refund"], "Triage", "Refund", "consult", RULE),
        (traces["bounce"], "Triage", "Refund", "delegate", RULE),
        (traces["bounce"], "Refund", "Triage", "delegate", RULE),
        (traces["failing"], "Triage", "Billing", "delegate", RULE),
    ]
    hid, pkg = failed_package(serve, start)
    assert hid.startswith(f"{traces['failing']}/")
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("Triage", "Billing")
    assert pkg["terminal"]["state"] == "failed"
    # status OK: the failure is the tool's output, as CrewAI returns it to the delegator
    assert (
        pkg["transitions"][-1]["attributes"]["handoff.error_code"]
        == "error_executing_task_with_agent"
    )
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
