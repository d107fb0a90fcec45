"""OTel GenAI semantic conventions: an app's `invoke_agent` spans and a transfer recorded as
an `execute_tool` span with `gen_ai.agent.handoff.source.name` / `.target.name`, emitted
with the real OTel SDK and OTLP/HTTP exporter (batched: the handoff and the target's run
arrive in different requests) to a real `handoffs serve`, which derives the handoffs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import analytics
from tests.integration._derived import wait_for_anomalies, wait_for_funnel

RULE = "genai.execute_tool.handoff"


@pytest.fixture(scope="module")
def serve(derive_serve):
    return derive_serve


@pytest.fixture
def tracer(serve):
    p = TracerProvider(resource=Resource.create({"service.name": "support-desk"}))
    p.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=2,
        )
    )
    yield p.get_tracer("support-desk")
    p.shutdown()


def invoke(tracer, agent: str, *, transfer_to: str | None = None, fail: bool = False) -> None:
    with tracer.start_as_current_span(
        f"invoke_agent {agent}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent},
    ) as run:
        with tracer.start_as_current_span(
            "chat gpt-x", attributes={"gen_ai.operation.name": "chat"}
        ):
            pass
        if fail:
            run.set_status(trace.Status(trace.StatusCode.ERROR, "model unavailable"))
        if transfer_to:
            with tracer.start_as_current_span(
                f"execute_tool transfer_to_{transfer_to}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": f"transfer_to_{transfer_to}",
                    "gen_ai.agent.handoff.source.name": agent,
                    "gen_ai.agent.handoff.target.name": transfer_to,
                },
            ):
                pass


def test_genai_transfers_become_handoffs(serve, tracer):
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    with tracer.start_as_current_span("conversation 1"):  # triage -> billing -> triage
        invoke(tracer, "triage", transfer_to="billing")
        invoke(tracer, "billing", transfer_to="triage")
        invoke(tracer, "triage")
    with tracer.start_as_current_span("conversation 2"):  # triage -> refunds, which fails
        invoke(tracer, "triage", transfer_to="refunds")
        invoke(tracer, "refunds", fail=True)
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    wait_for_funnel(serve, window, {"volume": 3, "settled": 3, "accepted": 3, "executed": 2})
    # the handed-back transfer names the first as its cause, which is never verified
    wait_for_anomalies(serve, window, {"bounce": 1, "consumed_before_verified": 1})
    with serve.client() as c:
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("triage", "refunds")
    assert pkg["terminal"]["state"] == "failed"
    assert pkg["transitions"][-1]["attributes"]["handoff.error_code"] == "model_unavailable"
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
    # `handoffs metrics --by origin`: the three are derived by the GenAI rule
    args = ["metrics", "--store", serve.query_url, "--database", serve.database, "--by", "origin"]
    span = [
        "--from",
        f"{window.start:%Y-%m-%dT%H:%M:%S.%fZ}",
        "--to",
        f"{window.end:%Y-%m-%dT%H:%M:%S.%fZ}",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "handoffs", *args, *span, "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    rows = {r["origin"]: r for r in json.loads(out)}
    assert rows.keys() == {f"derived:{RULE}"} and rows[f"derived:{RULE}"]["volume"] == 3
    table = subprocess.run(
        [sys.executable, "-m", "handoffs", *args, *span],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"derived:{RULE}" in table and "p_e2e %" in table
    bad = subprocess.run(
        [sys.executable, "-m", "handoffs", *args, "--by", "mode", *span],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--by origin combines with no other" in bad.stderr
    with urllib.request.urlopen(f"{serve.otlp_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    submitted = re.search(r"^handoffs_derive_submitted_total (\S+)$", text, re.M)
    assert submitted and float(submitted.group(1)) >= 13  # 5 + 5 + 3 derived transitions
    assert re.search(r"^handoffs_derive_errors_total 0\.0$", text, re.M)
