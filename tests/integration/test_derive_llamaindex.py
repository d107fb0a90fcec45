"""LlamaIndex AgentWorkflow, with `openinference-instrumentation-llama-index`: a real
AgentWorkflow app (tests/llamaindex/app.py, a scripted OpenAI-compatible server on loopback in
place of the remote model) runs in its own virtualenv (scripts/app-venv llamaindex) and
exports through the real OTLP/HTTP exporter, batched, to a real `handoffs serve`, which
derives the handoffs by the LlamaIndex dialect table (derive/dialects.py).

No span attribute names an agent: the source and the target's run are read from the
`current_agent_name='...'` in the workflow steps' inputs.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _derived import anomaly_counts, wait_for_funnel

import analytics

RULE = "openinference.llama_index.handoff"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def app_python() -> str:
    """The app venv's python (built from tests/llamaindex/requirements.txt on first use)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), "llamaindex"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_llamaindex_handoffs_become_handoffs(derive_serve, app_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    ran = subprocess.run(
        [app_python, str(ROOT / "tests" / "llamaindex" / "app.py"), serve.otlp_url],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    traces = json.loads(ran.stdout.strip().splitlines()[-1])
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing and refund: committed; bounce: triage -> refund -> triage, both committed;
    # failing: triage -> billing, billing's model call fails
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    # refund's handoff back names triage's as its cause, which is never verified
    assert anomaly_counts(serve, window) == {"bounce": 1, "consumed_before_verified": 1}
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, from_agent, to_agent, mode, attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        assert rows == [
            (traces["billing"], "triage", "billing", "transfer", RULE),
            (traces["refund"], "triage", "refund", "transfer", RULE),
            (traces["bounce"], "triage", "refund", "transfer", RULE),
            (traces["bounce"], "refund", "triage", "transfer", RULE),
            (traces["failing"], "triage", "billing", "transfer", RULE),
        ]
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert hid.startswith(f"{traces['failing']}/")
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "billing")
    assert pkg["terminal"]["state"] == "failed"
    # the model client's exception type (HTTP 500 from the scripted server)
    assert pkg["transitions"][-1]["attributes"]["handoff.error_code"] == "internalservererror"
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
