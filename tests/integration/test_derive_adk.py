"""Google ADK, with its built-in OpenTelemetry tracing: a real ADK multi-agent app
(tests/adk/app.py, a scripted model in place of the remote one) runs in ADK's own
virtualenv (scripts/app-venv adk: google-adk pins opentelemetry <= 1.44, the project >= 1.45)
and exports through the real OTLP/HTTP exporter, batched, to a real `handoffs serve`, which
derives the handoffs from ADK's spans.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _derived import anomaly_counts, wait_for_funnel

import analytics

RULE = "adk.transfer_to_agent.handoff"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def adk_python() -> str:
    """The ADK venv's python (built from tests/adk/requirements.txt on first use, then kept)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), "adk"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_adk_transfers_become_handoffs(derive_serve, adk_python):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    ran = subprocess.run(
        [adk_python, str(ROOT / "tests" / "adk" / "app.py"), serve.otlp_url],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    traces = json.loads(ran.stdout.strip().splitlines()[-1])
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    # bounce: triage -> coder -> triage, both committed; failing: triage -> refunds, failed;
    # named: triage -> coder, committed
    wait_for_funnel(
        serve, window, {"volume": 4, "settled": 4, "accepted": 4, "executed": 3, "committed": 3}
    )
    # coder's transfer back names triage's as its cause, which is never verified
    assert anomaly_counts(serve, window) == {"bounce": 1, "consumed_before_verified": 1}
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, from_agent, to_agent, attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        assert rows == [
            (traces["bounce"], "triage", "coder", RULE),
            (traces["bounce"], "coder", "triage", RULE),
            (traces["failing"], "triage", "refunds", RULE),
            (traces["named"], "triage", "coder", RULE),
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
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "refunds")
    assert pkg["terminal"]["state"] == "failed"
    assert (
        pkg["transitions"][-1]["attributes"]["handoff.error_code"]
        == "runtimeerror_scripted_model_failure"
    )  # ADK: "<type>: <message>"
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
