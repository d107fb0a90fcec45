"""Microsoft Agent Framework, with its built-in OpenTelemetry instrumentation: a real
`HandoffBuilder` workflow (tests/agent_framework/app.py, a fake OpenAI-compatible
chat-completions server on 127.0.0.1 in place of the remote model) runs in its own virtualenv
(scripts/app-venv agent_framework) and exports through the real OTLP/HTTP exporter, batched,
to a real `handoffs serve`, which derives the handoffs from the framework's spans and links.
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

RULE = "agent_framework.message.handoff"


@pytest.fixture(scope="module")
def af_python() -> str:
    return app_venv_python("agent_framework")


def test_agent_framework_handoffs_are_derived_from_messages_and_links(derive_serve, af_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    traces = run_app(af_python, "agent_framework", serve.otlp_url)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, whose model call failed
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund's handoff back names triage's as its cause, which is never verified
    wait_for_anomalies(serve, window, {"bounce": 1, "consumed_before_verified": 1})
    with serve.client() as c:
        rows = created_rows(
            serve, start, "trace_id, from_agent, to_agent, attributes['handoff.derived_by']"
        )
        assert rows == [
            (traces["billing"], "triage", "billing", RULE),
            (traces["refund"], "triage", "refund", RULE),
            (traces["bounce"], "triage", "refund", RULE),
            (traces["bounce"], "refund", "triage", RULE),
            (traces["failing"], "triage", "billing", RULE),
        ]
        hid, pkg = failed_package(serve, start)
        # the handoff span is the send; the target's run is joined to it by a stored link
        send_id = hid.split("/")[1]
        (run,) = c.query(
            f"SELECT SpanId FROM {serve.database}.otel_traces WHERE TraceId = {{tid:String}} "
            "AND has(`Links.SpanId`, {sid:String}) AND startsWith(SpanName, 'executor.process')",
            parameters={"tid": traces["failing"], "sid": send_id},
        ).result_columns[0]
    assert hid.startswith(f"{traces['failing']}/")
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    fail = pkg["transitions"][-1]["attributes"]
    assert fail["handoff.error_code"] == "chatclientexception"  # the span's error.type
    assert fail["handoff.execution.id"] == run
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
