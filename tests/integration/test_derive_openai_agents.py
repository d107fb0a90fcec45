"""OpenAI Agents SDK runs, instrumented by the real OpenInference and OpenLLMetry packages,
exported with the real OTLP/HTTP exporter to a real `handoffs serve`: serve derives the
handoffs, and they equal what the project's own adapter records on the same runs.

The only fake is the model vendor: a scripted OpenAI-compatible Chat Completions server on
loopback (derive.testing.ScriptedOpenAI), answering `transfer_to_<agent>` tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("agents")
pytest.importorskip("openinference.instrumentation.openai_agents")
pytest.importorskip("opentelemetry.instrumentation.openai_agents")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    add_trace_processor,
    set_trace_processors,
)
from openai import AsyncOpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import analytics
from collector.adapters.openai_agents import HandoffTracingProcessor
from derive.testing import ScriptedOpenAI
from serve.testing import wait_until

#: scenario -> scripts of the models (one per agent), and whether the run raises
SCENARIOS = {
    "single": ({"planner": ["tool:transfer_to_coder"], "coder": ["patched"]}, False),
    "bounce": (
        {"planner": ["tool:transfer_to_coder", "done"], "coder": ["tool:transfer_to_planner"]},
        False,
    ),
    "failing_target": ({"planner": ["tool:transfer_to_coder"], "coder": ["error"]}, True),
    "multiple": (
        {"planner": ["tool:transfer_to_coder|transfer_to_reviewer"], "coder": ["patched"]},
        False,
    ),
}
COUNTS = ("volume", "settled", "accepted", "executed", "evidenced", "committed")


@pytest.fixture(scope="module")
def serve(derive_serve):
    return derive_serve


@pytest.fixture
def provider(serve):
    """A TracerProvider batching to serve, as an application exports (several requests)."""
    p = TracerProvider(resource=Resource.create({"service.name": "agents-app"}))
    p.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"),
            schedule_delay_millis=100,
            max_export_batch_size=8,
        )
    )
    yield p
    set_trace_processors([])
    p.shutdown()


@contextlib.contextmanager
def instrumented(kind: str, provider):
    """The real instrumentation `kind` ("openinference" | "openllmetry") on the SDK."""
    set_trace_processors([])  # not the SDK's own exporter: nothing leaves the machine
    if kind == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    else:
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    inst = OpenAIAgentsInstrumentor()
    inst.instrument(tracer_provider=provider)
    try:
        yield
    finally:
        inst.uninstrument()


def run_scenario(name: str, provider, *, app_span: bool = False) -> None:
    scripts, raises = SCENARIOS[name]
    with ScriptedOpenAI(scripts) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="offline", max_retries=0)
        coder = Agent(name="coder", model=OpenAIChatCompletionsModel("coder", client))
        reviewer = Agent(name="reviewer", model=OpenAIChatCompletionsModel("reviewer", client))
        planner = Agent(
            name="planner",
            model=OpenAIChatCompletionsModel("planner", client),
            handoffs=[coder, reviewer],
        )
        coder.handoffs = [planner]
        span = (
            provider.get_tracer("app").start_as_current_span("request")
            if app_span
            else contextlib.nullcontext()
        )
        with span:
            if raises:
                with pytest.raises(Exception, match="scripted failure"):
                    asyncio.run(Runner.run(planner, "fix bug 12"))
            else:
                asyncio.run(Runner.run(planner, "fix bug 12"))
        assert all(fake.left(m) == 0 for m in scripts), "a scripted answer was not used"


def _window(start: datetime) -> analytics.Window:
    return analytics.Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))


def summary(serve, window) -> dict:
    """Funnel counts, by to_agent too, and anomaly counts: what must be equal."""
    with serve.client() as c:
        total = analytics.funnel(c, database=serve.database, window=window).iloc[0]
        by = analytics.funnel(c, database=serve.database, window=window, by=("to_agent",))
        kinds = analytics.anomalies(c, database=serve.database, window=window)
    return {
        "total": {k: int(total[k]) for k in COUNTS},
        "by_target": {r["to_agent"]: {k: int(r[k]) for k in COUNTS} for _, r in by.iterrows()},
        "anomalies": {r["kind"]: int(r["count"]) for _, r in kinds.iterrows() if r["count"]},
    }


def adapter_summary(serve, provider) -> dict:
    """The same scenarios recorded by the project's adapter alone."""
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    proc = HandoffTracingProcessor(tracer_provider=provider)
    set_trace_processors([proc])
    for name in SCENARIOS:
        run_scenario(name, provider)
    set_trace_processors([])
    assert proc.errors == 0
    provider.force_flush()
    serve.wait_stored()
    return summary(serve, _window(start))


@pytest.fixture(scope="module")
def adapter_expected(serve, tmp_path_factory):
    p = TracerProvider(resource=Resource.create({"service.name": "agents-app"}))
    p.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")))
    try:
        yield adapter_summary(serve, p)
    finally:
        p.shutdown()


def _derived_rows(serve, start: datetime, rule: str, end: datetime | None = None) -> list:
    end = end or datetime.now(UTC) + timedelta(days=1)
    with serve.client() as c:
        return c.query(
            f"SELECT handoff_id, event, span_id FROM {serve.database}.handoff_transitions "
            "WHERE time >= {t:DateTime64(9)} AND time < {e:DateTime64(9)} "
            "AND attributes['handoff.derived_by'] = {r:String} ORDER BY handoff_id, time, event",
            parameters={"t": start, "e": end, "r": rule},
        ).result_rows


def wait_for(serve, window, expected: dict, timeout: float = 30.0) -> dict:
    """The summary once it equals `expected` (or the last one, to show the difference)."""
    last: dict = {}

    def same() -> bool:
        last.update(summary(serve, window))
        return last == expected

    with contextlib.suppress(TimeoutError):
        wait_until(same, timeout, "the derived funnel", every=0.2)
    return last


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("openinference", "openinference.openai_agents.handoff"),
        ("openllmetry", "openllmetry.openai_agents.handoff"),
    ],
)
def test_derived_funnel_equals_the_adapter(serve, provider, adapter_expected, kind, rule):
    assert adapter_expected["total"] == {
        "volume": 6, "settled": 6, "accepted": 5, "executed": 4, "evidenced": 4, "committed": 4
    }  # fmt: skip
    # the bounce, plus whatever else the adapter's records show (the derived ones must equal)
    assert adapter_expected["anomalies"]["bounce"] == 1
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    with instrumented(kind, provider):
        for name in SCENARIOS:
            run_scenario(name, provider)
    provider.force_flush()
    window = _window(start)
    assert wait_for(serve, window, adapter_expected) == adapter_expected

    rows = _derived_rows(serve, start, rule)
    assert len(rows) == len({r[2] for r in rows}), "a derived span stored twice"
    # one handoff's evidence package, from derived transitions only
    with serve.client() as c:
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE time >= {t:DateTime64(9)} AND event = 'commit' "
            "AND attributes['handoff.derived_by'] = {r:String} ORDER BY time LIMIT 1",
            parameters={"t": start, "r": rule},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    assert [t["event"] for t in pkg["transitions"]] == [
        "create", "accept", "start", "prepare", "commit"
    ]  # fmt: skip
    assert (pkg["envelope"]["from_agent"], pkg["envelope"]["to_agent"]) == ("planner", "coder")
    assert pkg["terminal"]["state"] == "committed"
    assert all(t["attributes"]["handoff.derived_by"] == rule for t in pkg["transitions"])


def _stored_twice(serve) -> list[tuple]:
    """Derived spans stored more than once (span id -> copies)."""
    with serve.client() as c:
        return c.query(
            f"SELECT span_id, count() AS n FROM {serve.database}.handoff_transitions "
            "WHERE attributes['handoff.derived_by'] != '' GROUP BY span_id HAVING n > 1"
        ).result_rows


def _marker(serve, provider, kind: str, rule: str) -> None:
    """Run one more handoff and wait until it is derived: every pass before it is done."""
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    with instrumented(kind, provider):
        run_scenario("single", provider)
    provider.force_flush()
    wait_until(lambda: len(_derived_rows(serve, start, rule)) == 5, 30, "the marker derived")


def test_resent_spans_derive_nothing_twice(serve, provider):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    kept = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    with instrumented("openinference", provider):
        run_scenario("bounce", provider)
    provider.force_flush()
    rule = "openinference.openai_agents.handoff"
    wait_until(lambda: len(_derived_rows(serve, start, rule)) == 10, 30, "the bounce derived")
    before = summary(serve, _window(start))
    # a transport resend: the same spans again, in other requests
    resend = OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")
    spans = list(kept.get_finished_spans())
    for i in range(0, len(spans), 5):
        assert resend.export(spans[i : i + 5]).name == "SUCCESS"
    resend.shutdown()
    _marker(serve, provider, "openinference", rule)
    assert _stored_twice(serve) == []
    assert len(_derived_rows(serve, start, rule)) == 15  # the bounce's 10 + the marker's 5
    assert summary(serve, _window(start))["anomalies"] == before["anomalies"]
    assert before["anomalies"]["bounce"] == 1


def test_replay_after_restart_derives_nothing_twice(tmp_path):
    from serve.testing import start_serve

    env = {"HANDOFFS_DERIVE_EVERY_S": "0.25"}
    s = start_serve(tmp_path, env=env)
    p = TracerProvider(resource=Resource.create({"service.name": "agents-app"}))
    p.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{s.otlp_url}/v1/traces")))
    rule = "openllmetry.openai_agents.handoff"
    try:
        start = datetime.now(UTC) - timedelta(milliseconds=1)
        with instrumented("openllmetry", p):
            run_scenario("bounce", p)
        p.force_flush()
        wait_until(lambda: len(_derived_rows(s, start, rule)) == 10, 30, "the bounce derived")
        assert s.stop() == 0
        # the new serve's first pass reads the traces again (its cursor starts an hour back)
        s = start_serve(tmp_path, store_dir=s.store_dir, otlp_port=s.otlp_port, env=env)
        _marker(s, p, "openllmetry", rule)
        assert _stored_twice(s) == []
        assert len(_derived_rows(s, start, rule)) == 15
    finally:
        p.shutdown()
        s.stop()


@pytest.mark.parametrize("kind", ["openinference", "openllmetry"])
def test_adapter_and_instrumentation_on_one_run_count_once(serve, provider, adapter_expected, kind):
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    proc = HandoffTracingProcessor(tracer_provider=provider)
    with instrumented(kind, provider):
        add_trace_processor(proc)  # beside the instrumentation's processor
        for name in SCENARIOS:
            run_scenario(name, provider, app_span=True)  # one OTel trace per run
    set_trace_processors([])
    provider.force_flush()
    serve.wait_stored()
    window = analytics.Window(start=start, end=datetime.now(UTC))
    rule = f"{kind}.openai_agents.handoff"
    _marker(serve, provider, kind, rule)  # every pass over the runs above is done
    assert summary(serve, window) == adapter_expected
    assert _derived_rows(serve, start, rule, end=window.end) == []


def test_funnel_by_origin_tells_adapter_from_derived(serve, provider):
    from analytics.origin import funnel_by_origin

    start = datetime.now(UTC) - timedelta(milliseconds=1)
    proc = HandoffTracingProcessor(tracer_provider=provider)
    set_trace_processors([proc])
    run_scenario("single", provider)
    set_trace_processors([])
    with instrumented("openinference", provider):
        run_scenario("failing_target", provider)
    provider.force_flush()
    rule = "openinference.openai_agents.handoff"
    wait_until(lambda: len(_derived_rows(serve, start, rule)) == 4, 30, "the failure derived")
    with serve.client() as c:
        df = funnel_by_origin(c, database=serve.database, window=_window(start))
    got = {r["origin"]: (r["volume"], r["committed"], r["p_e2e"]) for _, r in df.iterrows()}
    assert got == {"adapter:openai_agents": (1, 1, 1.0), f"derived:{rule}": (1, 0, 0.0)}


@pytest.mark.parametrize("kind", ["openinference", "openllmetry"])
def test_on_the_same_runs_the_derived_funnel_equals_the_adapter_s(serve, provider, kind):
    """Adapter and instrumentation on the same runs, in two OTel traces (no application span
    joins them): both are stored, and per origin the funnels are equal."""
    from analytics.origin import funnel_by_origin

    start = datetime.now(UTC) - timedelta(milliseconds=1)
    proc = HandoffTracingProcessor(tracer_provider=provider)
    with instrumented(kind, provider):
        add_trace_processor(proc)
        for name in SCENARIOS:
            run_scenario(name, provider)
    set_trace_processors([])
    assert proc.errors == 0
    provider.force_flush()
    window = analytics.Window(start=start, end=datetime.now(UTC))
    rule = f"{kind}.openai_agents.handoff"

    def per_origin() -> dict:
        with serve.client() as c:
            df = funnel_by_origin(c, database=serve.database, window=window)
        return {r["origin"]: {k: int(r[k]) for k in COUNTS} for _, r in df.iterrows()}

    adapter, derived = "adapter:openai_agents", f"derived:{rule}"
    got: dict = {}

    def equal() -> bool:
        got.clear()
        got.update(per_origin())
        return set(got) == {adapter, derived} and got[adapter] == got[derived]

    with contextlib.suppress(TimeoutError):
        wait_until(equal, 30, "both origins", every=0.2)
    assert set(got) == {adapter, derived} and got[derived] == got[adapter]
    assert got["adapter:openai_agents"]["volume"] == 6
    # one bounce per origin: each records the run as its own task
    assert summary(serve, window)["anomalies"]["bounce"] == 2
