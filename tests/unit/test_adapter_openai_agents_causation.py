"""OpenAI Agents SDK adapter: chained handoffs of one run name the handoff they consume
(`handoff.causation_id`). Real Runner, scripted offline model, in-memory OTel recorder."""

from __future__ import annotations

import asyncio

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, set_trace_processors  # noqa: E402

from collector import InMemoryRecorder, semconv  # noqa: E402
from collector.adapters.openai_agents import HandoffTracingProcessor  # noqa: E402
from collector.adapters.openai_agents_testing import ScriptedModel  # noqa: E402


@pytest.fixture
def recorder():
    rec = InMemoryRecorder()
    yield rec
    rec.shutdown()


@pytest.fixture
def processor(recorder):
    p = HandoffTracingProcessor(tracer_provider=recorder.provider, deadline_ms=60_000)
    set_trace_processors([p])  # replaces the SDK's OpenAI exporter: nothing leaves the process
    yield p
    set_trace_processors([])


def _creates(recorder) -> list[dict]:
    return [t for t in recorder.transitions() if t[semconv.EVENT] == "create"]


def test_each_handoff_of_a_chain_names_the_one_it_consumes(recorder, processor):
    tester = Agent(name="tester", model=ScriptedModel([["all green"]]))
    reviewer = Agent(name="reviewer", model=ScriptedModel([["handoff:tester"]]), handoffs=[tester])
    coder = Agent(name="coder", model=ScriptedModel([["handoff:reviewer"]]), handoffs=[reviewer])
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    assert asyncio.run(Runner.run(planner, "fix bug 12")).final_output == "all green"
    by_src = {c[semconv.FROM_AGENT]: c for c in _creates(recorder)}
    a, b, c = by_src["planner"], by_src["coder"], by_src["reviewer"]
    assert semconv.CAUSATION_ID not in a  # the first of the run consumes no handoff
    assert b[semconv.CAUSATION_ID] == a[semconv.HANDOFF_ID]
    assert c[semconv.CAUSATION_ID] == b[semconv.HANDOFF_ID]
    assert processor.errors == 0


def test_handoffs_of_separate_runs_are_not_chained(recorder, processor):
    for _ in range(2):
        coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
        planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
        asyncio.run(Runner.run(planner, "fix bug 12"))
    creates = _creates(recorder)
    assert len(creates) == 2 and len({c[semconv.TASK_ID] for c in creates}) == 2
    assert all(semconv.CAUSATION_ID not in c for c in creates)


def test_ignored_handoffs_share_the_cause_of_the_chosen_one(recorder, processor):
    a = Agent(name="a", model=ScriptedModel([["done a"]]))
    b = Agent(name="b", model=ScriptedModel([["done b"]]))
    coder = Agent(name="coder", model=ScriptedModel([["handoff:a", "handoff:b"]]), handoffs=[a, b])
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    asyncio.run(Runner.run(planner, "fix bug 12"))
    creates = _creates(recorder)
    first = next(c for c in creates if c[semconv.FROM_AGENT] == "planner")
    from_coder = [c for c in creates if c[semconv.FROM_AGENT] == "coder"]
    assert len(from_coder) == 2  # the chosen one and the ignored (rejected) one
    assert {c[semconv.CAUSATION_ID] for c in from_coder} == {first[semconv.HANDOFF_ID]}
