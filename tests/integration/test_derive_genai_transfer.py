"""The GenAI agent-to-agent transfer attributes under review (`gen_ai.transfer.*` on
`execute_tool`, `gen_ai.caller.*` on `invoke_agent`) next to the older proposal
(`gen_ai.agent.handoff.*`), emitted with the real OTel SDK and OTLP/HTTP exporter (batched)
to a real `handoffs serve`, which derives the handoffs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import analytics
from tests.integration._derived import wait_for_funnel

RULE = "genai.execute_tool.handoff"


@pytest.fixture
def tracer(derive_serve):
    p = TracerProvider(resource=Resource.create({"service.name": "support-desk"}))
    p.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{derive_serve.otlp_url}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=2,
        )
    )
    yield p.get_tracer("support-desk")
    p.shutdown()


def invoke(tracer, agent: str, caller: str | None = None, transfer: dict | None = None) -> None:
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
    if caller:
        attrs |= {"gen_ai.caller.type": "agent", "gen_ai.caller.name": caller}
    with tracer.start_as_current_span(f"invoke_agent {agent}", attributes=attrs):
        with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}):
            pass
        if transfer:
            with tracer.start_as_current_span(
                "execute_tool route",
                attributes={"gen_ai.operation.name": "execute_tool", **transfer},
            ):
                pass


def test_transfer_attributes_become_handoffs(derive_serve, tracer):
    serve = derive_serve
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    with tracer.start_as_current_span("conversation 1"):  # pass_control, then return_to_caller
        invoke(tracer, "triage", transfer={
            "gen_ai.transfer.mode": "pass_control", "gen_ai.transfer.target.name": "billing",
            "gen_ai.transfer.target.type": "agent"})  # fmt: skip
        invoke(tracer, "billing", caller="triage", transfer={
            "gen_ai.transfer.mode": "return_to_caller", "gen_ai.transfer.target.name": "ledger",
            "gen_ai.transfer.target.type": "agent"})  # fmt: skip
        invoke(tracer, "ledger", caller="billing")
    with tracer.start_as_current_span("conversation 2"):  # to a human; the older proposal
        invoke(tracer, "triage", transfer={
            "gen_ai.transfer.mode": "pass_control", "gen_ai.transfer.target.name": "desk",
            "gen_ai.transfer.target.type": "human"})  # fmt: skip
        invoke(tracer, "triage", transfer={
            "gen_ai.agent.handoff.source.name": "triage",
            "gen_ai.agent.handoff.target.name": "refund"})  # fmt: skip
        invoke(tracer, "refund")
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    wait_for_funnel(
        serve, window, {"volume": 4, "settled": 4, "accepted": 3, "executed": 3, "committed": 3}
    )
    with serve.client() as c:
        rows = c.query(
            f"SELECT from_agent, to_agent, mode, attributes['handoff.derived_by'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        ends = c.query(
            f"SELECT actor, event, to_state FROM {serve.database}.handoff_transitions "
            "WHERE event IN ('commit', 'escalate') AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
    assert rows == [
        ("triage", "billing", "transfer", RULE),
        ("billing", "ledger", "delegate", RULE),
        ("triage", "desk", "escalate", RULE),
        ("triage", "refund", "transfer", RULE),
    ]
    assert ends == [
        ("billing", "commit", "committed"),
        ("ledger", "commit", "committed"),
        ("triage", "escalate", "escalated"),  # the sender escalates: no span shows the desk
        ("refund", "commit", "committed"),
    ]
