"""OpenAI Agents SDK adapter, `Agent.as_tool()` and handoff input filters: the real SDK
Runner with the scripted offline model, recorded in memory."""

from __future__ import annotations

import asyncio

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, function_tool, handoff  # noqa: E402
from agents.extensions import handoff_filters  # noqa: E402

from collector import semconv  # noqa: E402
from collector.adapters.openai_agents import HandoffTracingProcessor  # noqa: E402
from collector.adapters.openai_agents_testing import ScriptedModel  # noqa: E402
from tests.unit import test_adapter_openai_agents_offline as offline  # noqa: E402

# the offline module's fixtures: no network, an in-memory recorder, the registered processor
_no_network, recorder, processor = offline._no_network, offline.recorder, offline.processor


def _run(agent, text="go"):
    return asyncio.run(Runner.run(agent, text))


def _by_handoff(rec) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in rec.transitions():
        out.setdefault(t[semconv.HANDOFF_ID], []).append(t)
    return out


def test_as_tool_delegation_becomes_an_agent_as_tool_handoff(recorder, processor):
    expert = Agent(name="expert", model=ScriptedModel([["answer A"]]))
    orch = Agent(
        name="orch",
        model=ScriptedModel([['tool:ask_expert:{"input": "q1"}'], ["final"]]),
        tools=[expert.as_tool("ask_expert", "asks the expert")],
    )
    assert _run(orch).final_output == "final"
    (ts,) = _by_handoff(recorder).values()
    assert [(t[semconv.EVENT], t[semconv.ACTOR]) for t in ts] == [
        ("create", "orch"),
        ("accept", "expert"),
        ("start", "expert"),
        ("prepare", "expert"),
        ("commit", "expert"),
    ]
    create = ts[0]
    assert (create[semconv.TOPOLOGY], create[semconv.MODE]) == ("agent_as_tool", "delegate")
    assert (create[semconv.FROM_AGENT], create[semconv.TO_AGENT]) == ("orch", "expert")
    assert create[semconv.HANDOFF_ID].startswith("span_")  # the SDK's tool-call span
    assert ts[3][semconv.EVIDENCE_COUNT] == 1  # the expert's one model turn
    assert semconv.HISTORY_ITEMS not in create  # not a transfer
    assert processor.errors == 0


def test_fan_out_to_two_experts_one_failing(recorder, processor):
    e1 = Agent(name="e1", model=ScriptedModel([["a1"]]))
    e2 = Agent(name="e2", model=ScriptedModel([RuntimeError("e2 down")]))
    orch = Agent(
        name="orch",
        model=ScriptedModel(
            [['tool:ask_e1:{"input": "q"}', 'tool:ask_e2:{"input": "q"}'], ["final"]]
        ),
        tools=[e1.as_tool("ask_e1", "one"), e2.as_tool("ask_e2", "two")],
    )
    assert _run(orch).final_output == "final"  # the SDK hands e2's error back to the model
    hs = _by_handoff(recorder)
    last = {
        v[0][semconv.TO_AGENT]: (v[-1][semconv.EVENT], v[-1].get(semconv.ERROR_CODE))
        for v in hs.values()
    }
    assert last == {"e1": ("commit", None), "e2": ("fail", "error_in_agent_run")}
    assert len({t[semconv.TASK_ID] for v in hs.values() for t in v}) == 1
    assert processor.errors == 0


def test_a_plain_function_tool_is_no_handoff(recorder, processor):
    @function_tool
    def lookup(q: str) -> str:
        """Look it up."""
        return "found"

    solo = Agent(name="solo", model=ScriptedModel([['tool:lookup:{"q": "x"}'], ["done"]]),
                 tools=[lookup])  # fmt: skip
    assert _run(solo).final_output == "done"
    assert recorder.transitions() == []


def _planner(coder, input_filter):
    @function_tool
    def lookup(q: str) -> str:
        """Look it up."""
        return "found it"

    return Agent(
        name="planner",
        model=ScriptedModel([['tool:lookup:{"q": "x"}'], ["handoff:coder"]]),
        tools=[lookup],
        handoffs=[handoff(coder, input_filter=input_filter)],
    )


def test_an_observed_input_filter_is_recorded_on_the_create(recorder, processor):
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    observed = processor.observe_input_filter(handoff_filters.remove_all_tools)
    assert _run(_planner(coder, observed), "fix bug 12, my password=hunter2").final_output == (
        "patched"
    )
    (ts,) = _by_handoff(recorder).values()
    create = ts[0]
    # history: the input (1) + the lookup call and output (2) + the handoff call and output
    # (2); remove_all_tools drops the four tool items and keeps the input, password and all
    assert (
        create[semconv.HISTORY_ITEMS],
        create[semconv.HISTORY_SENSITIVE_ITEMS],
        create[semconv.HISTORY_REMOVED_ITEMS],
        create[semconv.INPUT_FILTER],
    ) == (5, 1, 4, "remove_all_tools")
    assert [t[semconv.EVENT] for t in ts][-1] == "commit"
    assert processor.errors == 0


def test_an_async_filter_with_a_name_and_an_unobserved_one(recorder, processor):
    async def keep_all(data):
        return data

    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    named = processor.observe_input_filter(keep_all, name="keep-all")
    _run(_planner(coder, named))
    (ts,) = _by_handoff(recorder).values()
    assert (ts[0][semconv.INPUT_FILTER], ts[0][semconv.HISTORY_REMOVED_ITEMS]) == ("keep-all", 0)
    assert ts[0][semconv.HISTORY_ITEMS] == 5
    recorder.clear()
    coder2 = Agent(name="coder", model=ScriptedModel([["patched"]]))
    _run(_planner(coder2, handoff_filters.remove_all_tools))  # not observed: nothing claimed
    (ts,) = _by_handoff(recorder).values()
    assert semconv.INPUT_FILTER not in ts[0] and semconv.HISTORY_ITEMS not in ts[0]
    assert processor.errors == 0


def test_observe_input_filter_refuses_bad_arguments(recorder):
    p = HandoffTracingProcessor(tracer_provider=recorder.provider)
    with pytest.raises(ValueError, match="input_filter: expected a callable"):
        p.observe_input_filter("remove_all_tools")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name: expected a non-empty str"):
        p.observe_input_filter(handoff_filters.remove_all_tools, name="")


def test_scripted_model_names_a_missing_tool(recorder, processor):
    solo = Agent(name="solo", model=ScriptedModel([["tool:nope"]]))
    with pytest.raises(ValueError, match="no tool 'nope'"):
        _run(solo)
