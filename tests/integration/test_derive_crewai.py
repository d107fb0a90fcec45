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

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _derived import anomaly_counts, wait_for_funnel

import analytics

RULE = "openinference.crewai.delegation"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def app_python() -> str:
    """The app venv's python (built from tests/crewai/requirements.txt on first use)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), "crewai"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_crewai_delegations_become_handoffs(derive_serve, app_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    ran = subprocess.run(
        [app_python, str(ROOT / "tests" / "crewai" / "app.py"), serve.otlp_url],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    traces = json.loads(ran.stdout.strip().splitlines()[-1])
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # billing, refund (a question), bounce (two delegations): committed; failing: failed
    wait_for_funnel(
        serve, window, {"volume": 5, "settled": 5, "accepted": 5, "executed": 4, "committed": 4}
    )
    assert "bounce" not in anomaly_counts(serve, window)  # delegations, not transfers
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, from_agent, to_agent, mode, attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        assert rows == [
            (traces["billing"], "Triage", "Billing", "delegate", RULE),
            (traces["refund"], "Triage", "Refund", "consult", RULE),
            (traces["bounce"], "Triage", "Refund", "delegate", RULE),
            (traces["bounce"], "Refund", "Triage", "delegate", RULE),
            (traces["failing"], "Triage", "Billing", "delegate", RULE),
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
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("Triage", "Billing")
    assert pkg["terminal"]["state"] == "failed"
    # status OK: the failure is the tool's output, as CrewAI returns it to the delegator
    assert (
        pkg["transitions"][-1]["attributes"]["handoff.error_code"]
        == "error_executing_task_with_agent"
    )
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
