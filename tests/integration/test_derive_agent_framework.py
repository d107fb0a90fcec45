"""Microsoft Agent Framework, with its built-in OpenTelemetry instrumentation: a real
`HandoffBuilder` workflow (tests/agent_framework/app.py, a fake OpenAI-compatible
chat-completions server on 127.0.0.1 in place of the remote model) runs in its own virtualenv
(scripts/app-venv agent_framework) and exports through the real OTLP/HTTP exporter, batched,
to a real `handoffs serve`, which derives the handoffs from the framework's spans and links.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _derived import anomaly_counts, wait_for_funnel

import analytics

RULE = "agent_framework.message.handoff"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def af_python() -> str:
    """The app venv's python (built from tests/agent_framework/requirements.txt on first use,
    then kept)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), "agent_framework"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_agent_framework_handoffs_are_derived_from_messages_and_links(derive_serve, af_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    ran = subprocess.run(
        [af_python, str(ROOT / "tests" / "agent_framework" / "app.py"), serve.otlp_url],
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
    # refund's handoff back names triage's as its cause, which is never verified
    assert anomaly_counts(serve, window) == {"bounce": 1, "consumed_before_verified": 1}
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, from_agent, to_agent, attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        assert rows == [
            (traces["billing"], "triage", "billing", RULE),
            (traces["refund"], "triage", "refund", RULE),
            (traces["bounce"], "triage", "refund", RULE),
            (traces["bounce"], "refund", "triage", RULE),
            (traces["failing"], "triage", "billing", RULE),
        ]
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert analytics.verify_package(c, pkg, database=serve.database).ok
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
