"""LangGraph multi-agent apps (langgraph-swarm, langgraph-supervisor), instrumented by the
real `openinference-instrumentation-langchain`, exported with the real OTLP/HTTP exporter to
a real `handoffs serve`, which derives the handoffs.

The trap: langgraph-swarm hands off by raising `ParentCommand`, an `exception` event on
spans whose status is OK; a handoff must not read as a failure. The only fake is the model
vendor (derive.testing.ScriptedOpenAI on loopback).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("langgraph_swarm")
pytest.importorskip("langgraph_supervisor")
pytest.importorskip("openinference.instrumentation.langchain")

from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from langgraph_supervisor import create_supervisor
from langgraph_swarm import create_handoff_tool, create_swarm
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import SecretStr

import analytics
from derive.testing import ScriptedOpenAI
from tests.integration._derived import wait_for_anomalies, wait_for_funnel

RULE = "openinference.langgraph.handoff"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def serve(derive_serve):
    return derive_serve


@pytest.fixture
def provider(serve):
    p = TracerProvider(resource=Resource.create({"service.name": "graph-app"}))
    p.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"),
            schedule_delay_millis=100,
            max_export_batch_size=16,
        )
    )
    inst = LangChainInstrumentor()
    inst.instrument(tracer_provider=p)
    yield p
    inst.uninstrument()
    p.shutdown()


def _model(fake: ScriptedOpenAI, name: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=name, base_url=fake.base_url, api_key=SecretStr("offline"), max_retries=0
    )


def run_swarm(scripts: dict, *, raises: bool = False) -> None:
    with ScriptedOpenAI(scripts) as fake:
        alice = create_react_agent(
            _model(fake, "alice"), [create_handoff_tool(agent_name="bob")], name="alice"
        )
        bob = create_react_agent(
            _model(fake, "bob"), [create_handoff_tool(agent_name="alice")], name="bob"
        )
        app = create_swarm([alice, bob], default_active_agent="alice").compile()
        request = {"messages": [{"role": "user", "content": "refund order 7"}]}
        if raises:
            with pytest.raises(Exception, match="scripted failure"):
                app.invoke(request)
        else:
            app.invoke(request)
        assert all(fake.left(m) == 0 for m in scripts)


def run_supervisor() -> None:
    scripts = {"supervisor": ["tool:transfer_to_coder", "done"], "coder": ["patched"]}
    with ScriptedOpenAI(scripts) as fake:
        coder = create_react_agent(_model(fake, "coder"), [], name="coder")
        app = create_supervisor([coder], model=_model(fake, "supervisor")).compile()
        app.invoke({"messages": [{"role": "user", "content": "fix bug 12"}]})
        assert all(fake.left(m) == 0 for m in scripts)


def test_langgraph_handoffs_are_derived(serve, provider):
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    # alice -> bob -> alice: a transfer handed straight back (ParentCommand on OK spans)
    run_swarm({"alice": ["tool:transfer_to_bob", "done"], "bob": ["tool:transfer_to_alice"]})
    run_swarm({"alice": ["tool:transfer_to_bob"], "bob": ["error"]}, raises=True)
    run_supervisor()
    provider.force_flush()
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))

    wait_for_funnel(
        serve, window, {"volume": 4, "settled": 4, "accepted": 4, "executed": 3, "committed": 3}
    )
    # bob's handoff back names alice's as its cause, which is never verified
    wait_for_anomalies(serve, window, {"bounce": 1, "consumed_before_verified": 1})
    with serve.client() as c:
        pairs = c.query(
            f"SELECT from_agent, to_agent FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": start},
        ).result_rows
        assert pairs == [("alice", "bob"), ("bob", "alice"), ("alice", "bob"),
                         ("supervisor", "coder")]  # fmt: skip
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": start},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "fail"]
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("alice", "bob")
    assert {t["attributes"]["handoff.derived_by"] for t in pkg["transitions"]} == {RULE}
