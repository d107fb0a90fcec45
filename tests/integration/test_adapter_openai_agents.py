"""OpenAI Agents SDK -> our processor -> real OTLP exporter -> `handoffs serve` -> analytics.

A real Runner with a scripted offline model (no network); the transitions travel through the
OTel SDK's OTLP/HTTP exporter to a serve subprocess and are read back through serve's
ClickHouse HTTP query port with the analytics API.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, handoff, set_trace_processors
from agents.extensions import handoff_filters
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import analytics
from collector.adapters.openai_agents import HandoffTracingProcessor
from collector.adapters.openai_agents_testing import ScriptedModel


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("adapter-openai"))
    yield s
    s.stop()


@pytest.fixture
def run_observed(serve):
    """run_observed(agent) -> (window, handoff ids): run with our processor exporting to serve."""
    provider = TracerProvider(resource=Resource.create({"service.name": "agents-app"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"))
    )
    proc = HandoffTracingProcessor(tracer_provider=provider, deadline_ms=60_000)
    set_trace_processors([proc])  # only ours: the SDK's OpenAI exporter is gone

    def run(agent, *, raises=None):
        start = datetime.now(UTC) - timedelta(milliseconds=1)
        if raises is None:
            asyncio.run(Runner.run(agent, "fix bug 12"))
        else:
            with pytest.raises(raises):
                asyncio.run(Runner.run(agent, "fix bug 12"))
        proc.force_flush()
        serve.wait_stored()
        assert proc.errors == 0
        return analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    run.processor = proc  # type: ignore[attr-defined]  # for observe_input_filter
    yield run
    set_trace_processors([])
    provider.shutdown()


def _funnel(serve, window, **kw):
    with serve.client() as c:
        return analytics.funnel(c, database=serve.database, window=window, **kw)


def test_single_handoff_funnel_and_evidence_package(serve, run_observed):
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    window = run_observed(planner)

    row = _funnel(serve, window).iloc[0]
    assert (row["volume"], row["settled"], row["committed"], row["evidenced"]) == (1, 1, 1, 1)
    assert row["p_e2e"] == 1.0

    with serve.client() as c:
        (hid,) = c.query(
            f"SELECT DISTINCT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)}",
            parameters={"t": window.start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert [t["event"] for t in pkg["transitions"]] == [
        "create", "accept", "start", "prepare", "commit"
    ]  # fmt: skip
    assert pkg["envelope"]["from_agent"] == "planner" and pkg["envelope"]["to_agent"] == "coder"
    assert pkg["envelope"]["mode"] == "transfer"
    assert pkg["terminal"]["state"] == "committed"
    assert pkg["terminal"]["receipt"]["status"] == "ok"
    assert pkg["execution"]["execution_id"].startswith("span_")  # the coder's SDK agent span
    assert len({t["trace_id"] for t in pkg["transitions"]}) == 1
    assert pkg["anomalies"] == []


def test_multiple_handoffs_show_a_rejected_handoff(serve, run_observed):
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    reviewer = Agent(name="reviewer", model=ScriptedModel([["never runs"]]))
    planner = Agent(
        name="planner",
        model=ScriptedModel([["handoff:coder", "handoff:reviewer"]]),
        handoffs=[coder, reviewer],
    )
    window = run_observed(planner)

    by_target = _funnel(serve, window, by=("to_agent",)).set_index("to_agent")
    assert by_target.loc["coder", "committed"] == 1 and by_target.loc["coder", "p_e2e"] == 1.0
    assert by_target.loc["reviewer", "settled"] == 1
    assert by_target.loc["reviewer", "accepted"] == 0  # rejected: never accepted
    total = _funnel(serve, window).iloc[0]
    assert (total["settled"], total["committed"], total["p_e2e"]) == (2, 1, 0.5)
    with serve.client() as c:
        rows = c.query(
            f"SELECT event, to_agent, error_code FROM {serve.database}.handoff_transitions "
            "WHERE event = 'reject' AND time >= {t:DateTime64(9)}",
            parameters={"t": window.start},
        ).result_rows
    assert rows == [("reject", "", "multiple_handoffs")]


def test_target_failure_is_a_failed_handoff(serve, run_observed):
    coder = Agent(name="coder", model=ScriptedModel([RuntimeError("model down")]))
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    window = run_observed(planner, raises=RuntimeError)
    row = _funnel(serve, window).iloc[0]
    assert (row["settled"], row["accepted"], row["executed"], row["committed"]) == (1, 1, 0, 0)
    assert row["p_e2e"] == 0.0


def test_a_chained_run_stores_each_handoffs_cause(serve, run_observed):
    reviewer = Agent(name="reviewer", model=ScriptedModel([["lgtm"]]))
    coder = Agent(name="coder", model=ScriptedModel([["handoff:reviewer"]]), handoffs=[reviewer])
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    window = run_observed(planner)
    with serve.client() as c:
        rows = c.query(
            "SELECT from_agent, handoff_id, attributes['handoff.causation_id'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": window.start},
        ).result_rows
    by_src = {src: (hid, cause) for src, hid, cause in rows}
    assert by_src["planner"][1] == ""  # the first of the run consumes nothing
    assert by_src["coder"][1] == by_src["planner"][0]


def test_as_tool_and_an_observed_input_filter_arrive_in_serve(serve, run_observed):
    expert = Agent(name="expert", model=ScriptedModel([["the flaky test is test_login"]]))
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    strip = run_observed.processor.observe_input_filter(handoff_filters.remove_all_tools)
    planner = Agent(
        name="planner",
        model=ScriptedModel([['tool:ask_expert:{"input": "which test?"}'], ["handoff:coder"]]),
        tools=[expert.as_tool("ask_expert", "finds the flaky test")],
        handoffs=[handoff(coder, input_filter=strip)],
    )
    window = run_observed(planner)
    with serve.client() as c:
        rows = c.query(
            "SELECT to_agent, topology, mode, attributes['handoff.input_filter'], "
            "attributes['handoff.history.items'], attributes['handoff.history.removed_items'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": window.start},
        ).result_rows
    # history: the input, the ask_expert call and output, the handoff call and output
    assert rows == [
        ("expert", "agent_as_tool", "delegate", "", "", ""),
        ("coder", "in_process", "transfer", "remove_all_tools", "5", "4"),
    ]
    funnel = _funnel(serve, window)
    assert (funnel.iloc[0]["volume"], funnel.iloc[0]["committed"]) == (2, 2)
