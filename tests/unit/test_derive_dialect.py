"""The dialect interpreter (derive._dialect) and the LlamaIndex and CrewAI tables
(derive.dialects) on plain span records, shaped as their OpenInference instrumentations
record them."""

from __future__ import annotations

import json
from dataclasses import replace

from derive import SpanEvent, SpanRecord, derive_trace
from derive._dialect import Dialect, Failure, Find, Handoff, NextRun, Read, Spans, observe
from derive._trace import TraceIndex
from derive.dialects import CREWAI, CREWAI_SCOPE, LLAMA_INDEX, LLAMA_INDEX_SCOPE

T = "2bf7651916cd43dd8448eb211c80319c"
MS = 1_000_000
WF = "00000000000000a1"
KIND = "openinference.span.kind"


def span(sid, parent, name, start, end, scope, status="Ok", message="", events=(), **attrs):
    return SpanRecord(
        trace_id=T, span_id=sid, parent_span_id=parent, name=name, start_ns=start * MS,
        end_ns=end * MS, status=status, status_message=message, scope=scope,
        service_name="app", attributes=attrs, events=tuple(events),
    )  # fmt: skip


# -- LlamaIndex AgentWorkflow ----------------------------------------------------------------


def li(sid, parent, name, start, end, kind="CHAIN", **kw):
    return span(sid, parent, name, start, end, LLAMA_INDEX_SCOPE, **{KIND: kind}, **kw)


def step(sid, agent, start, end, status="Ok"):
    """One agent step; the agent only in the repr of its input event."""
    ev = f"AgentSetup(input=[...], current_agent_name='{agent}')"
    events: tuple[SpanEvent, ...] = ()
    if status == "Error":
        events = (
            SpanEvent("exception", end * MS, {"exception.type": "openai.InternalServerError"}),
        )
    return li(sid, WF, "AgentWorkflow.run_agent_step", start, end, status=status,
              message="InternalServerError: Error code: 500" if status == "Error" else "",
              events=events, **{"input.value": json.dumps({"ev": ev})})  # fmt: skip


def llm(sid, parent, start, end, status="Ok"):
    return li(sid, parent, "OpenAILike.astream_chat", start, end, kind="LLM", status=status)


def handoff(sid, to, start):
    call = f"{sid[:-1]}c"
    args = {"kwargs": {"to_agent": to, "reason": "theirs", "ctx": "<Context>"}}
    return [
        li(call, WF, "AgentWorkflow.call_tool", start, start + 3),
        li(sid, call, "FunctionTool.acall", start + 1, start + 2, kind="TOOL",
           **{"tool.name": "handoff", "input.value": json.dumps(args)}),
    ]  # fmt: skip


def li_bounce(failing=False):
    """triage -> refund -> triage (or triage -> billing, failing)."""
    spans = [
        step("00000000000000b1", "triage", 1, 5),
        llm("00000000000000b2", "00000000000000b1", 2, 4),
        *handoff("00000000000000b3", "billing" if failing else "refund", 6),
    ]
    if failing:
        return [
            *spans,
            step("00000000000000d1", "billing", 10, 15, status="Error"),
            llm("00000000000000d2", "00000000000000d1", 11, 14, status="Error"),
        ]
    return [
        *spans,
        step("00000000000000d1", "refund", 10, 15),
        llm("00000000000000d2", "00000000000000d1", 11, 14),
        *handoff("00000000000000d3", "triage", 16),
        step("00000000000000e1", "triage", 20, 25),
        llm("00000000000000e2", "00000000000000e1", 21, 24),
    ]


def li_workflow(end=30, status="Ok"):
    return li(WF, "", "AgentWorkflow.run", 0, end, status=status)


def test_llamaindex_bounce_is_two_transfers_the_second_caused_by_the_first():
    out = observe(TraceIndex([li_workflow(), *li_bounce()]), LLAMA_INDEX)
    assert [(o.from_agent, o.to_agent, o.mode) for o in out] == [
        ("triage", "refund", "transfer"),
        ("refund", "triage", "transfer"),
    ]
    first, back = out
    assert first.target is not None and first.target.span.span_id == "00000000000000d1"
    assert back.target is not None and back.target.span.span_id == "00000000000000e1"
    assert back.causation_id == first.handoff_id == f"{T}/00000000000000b3"
    assert first.task_id == f"{T}/{WF}" and first.run_ended_ns == 30 * MS
    assert first.target.evidence == ("openinference:00000000000000d2",)
    derived = derive_trace([li_workflow(), *li_bounce()])
    assert [d.attr("handoff.event") for d in derived] == ["create", "accept", "start", "prepare",
                                                          "commit"] * 2  # fmt: skip
    assert {d.attr("handoff.derived_by") for d in derived} == {LLAMA_INDEX.rule}


def test_llamaindex_failed_model_call_fails_the_handoff_with_the_exception_type():
    out = observe(TraceIndex([li_workflow(status="Error"), *li_bounce(failing=True)]), LLAMA_INDEX)
    assert [(o.from_agent, o.to_agent) for o in out] == [("triage", "billing")]
    assert out[0].target is not None and out[0].target.error == "internalservererror"
    fail = derive_trace([li_workflow(status="Error"), *li_bounce(failing=True)])[-1]
    assert fail.attr("handoff.event") == "fail"
    assert fail.attr("handoff.error_code") == "internalservererror"


def test_llamaindex_waits_for_the_workflow_span_then_for_the_target():
    assert observe(TraceIndex(li_bounce()), LLAMA_INDEX) == []  # the run is not known yet
    before_target = [s for s in li_bounce() if s.start_ns < 10 * MS]
    # the workflow span stored without the target's step: the run ended before it ran
    ended = derive_trace([li_workflow(end=9), *before_target])
    assert [d.attr("handoff.event") for d in ended] == ["create", "accept", "start", "fail"]
    assert ended[-1].attr("handoff.error_code") == "run_ended_before_target_finished"


def test_llamaindex_a_handoff_tool_that_failed_is_no_handoff():
    spans = [li_workflow(), *li_bounce()]
    spans = [replace(s, status="Error") if s.span_id == "00000000000000b3" else s for s in spans]
    assert [o.handoff_id for o in observe(TraceIndex(spans), LLAMA_INDEX)] == [
        f"{T}/00000000000000d3"
    ]


def test_llamaindex_source_is_read_only_within_the_same_workflow():
    other = replace(step("00000000000000f1", "billing", 5, 6), parent_span_id="00000000000000a2")
    spans = [li_workflow(), li(other.parent_span_id, "", "AgentWorkflow.run", 0, 30), other,
             *li_bounce()]  # fmt: skip
    assert observe(TraceIndex(spans), LLAMA_INDEX)[0].from_agent == "triage"


# -- CrewAI ------------------------------------------------------------------------------------


def crew(sid, parent, name, start, end, kind, **kw):
    return span(sid, parent, name, start, end, CREWAI_SCOPE, **{KIND: kind}, **kw)


def kickoff(end=50):
    return crew(WF, "", "Crew_1.kickoff", 0, end, "CHAIN")


def task(sid, role, start, end):
    return crew(sid, WF, f"{role}._execute_core", start, end, "AGENT", **{"graph.node.id": role})


def delegation(sid, parent, coworker, start, output, tool="Delegate work to coworker"):
    args = {"task": "look at invoice 7", "context": "invoice 7", "coworker": coworker}
    return crew(sid, parent, f"{tool}.run", start, start + 5, "TOOL",
                **{"tool.name": tool, "input.value": json.dumps(args), "output.value": output})  # fmt: skip


def test_crewai_delegation_commits_from_the_tool_output():
    spans = [kickoff(), task("00000000000000b1", "Triage", 1, 20),
             delegation("00000000000000b2", "00000000000000b1", "Billing", 2, "invoice 7 is paid")]  # fmt: skip
    (o,) = observe(TraceIndex(spans), CREWAI)
    assert (o.from_agent, o.to_agent, o.mode) == ("Triage", "Billing", "delegate")
    assert o.target is not None and o.target.span.span_id == "00000000000000b2"
    assert o.target.error is None and o.target.evidence == ("openinference:00000000000000b2",)
    derived = derive_trace(spans)
    assert [d.attr("handoff.event") for d in derived] == ["create", "accept", "start", "prepare",
                                                          "commit"]  # fmt: skip
    assert derived[3].attr("handoff.evidence.count") == 1


def test_crewai_failed_coworker_is_an_ok_span_with_an_error_output():
    out = "Error executing task with agent 'billing'. Error: Error code: 500"
    spans = [kickoff(), task("00000000000000b1", "Triage", 1, 20),
             delegation("00000000000000b2", "00000000000000b1", "Billing", 2, out)]  # fmt: skip
    derived = derive_trace(spans)
    assert [d.attr("handoff.event") for d in derived] == ["create", "accept", "start", "fail"]
    assert derived[-1].attr("handoff.error_code") == "error_executing_task_with_agent"


def test_crewai_question_is_a_consult_and_a_later_task_delegating_back_has_no_cause():
    spans = [kickoff(), task("00000000000000b1", "Triage", 1, 10),
             delegation("00000000000000b2", "00000000000000b1", "Refund", 2, "no",
                        tool="Ask question to coworker"),
             task("00000000000000c1", "Refund", 11, 20),
             delegation("00000000000000c2", "00000000000000c1", "Triage", 12, "done")]  # fmt: skip
    out = observe(TraceIndex(spans), CREWAI)
    assert [(o.from_agent, o.to_agent, o.mode, o.causation_id) for o in out] == [
        ("Triage", "Refund", "consult", None),
        ("Refund", "Triage", "delegate", None),
    ]


def test_crewai_waits_for_the_kickoff_span():
    spans = [task("00000000000000b1", "Triage", 1, 20),
             delegation("00000000000000b2", "00000000000000b1", "Billing", 2, "paid")]  # fmt: skip
    assert observe(TraceIndex(spans), CREWAI) == []


# -- the interpreter's parts -------------------------------------------------------------------


def test_read_attribute_json_path_and_pattern():
    s = span("00000000000000b1", "", "x", 0, 1, "s", **{
        "a": "plain", "j": '{"k": {"n": "deep"}, "x": 1}', "r": "AgentSetup(current_agent_name='bob')"})  # fmt: skip
    assert Read("a")(s) == "plain"
    assert Read("j", path=("k", "n"))(s) == "deep"
    assert Read("j", path=("x",))(s) is None  # not a string
    assert Read("j", path=("missing", "n"))(s) is None
    assert Read("a", path=("k",))(s) is None  # not JSON
    assert Read("r", pattern=r"current_agent_name='([^']+)'")(s) == "bob"
    assert Read("r", pattern=r"nothing='(\w+)'")(s) is None
    assert Read("absent")(s) is None


def test_spans_match_every_condition_given():
    s = span("00000000000000b1", "", "Crew_9.kickoff", 0, 1, "openinference.instrumentation.crewai",
             **{KIND: "CHAIN"})  # fmt: skip
    assert Spans()(s)
    assert Spans("openinference.instrumentation", suffixes=(".kickoff",), attrs=((KIND, "CHAIN"),))(
        s
    )
    assert not Spans(names=("kickoff",))(s)
    assert not Spans(attrs=((KIND, "AGENT"),))(s)
    assert not Spans("other")(s)


def test_failure_codes():
    f = Failure(output_prefixes=("Oops",))
    ok = span("00000000000000b1", "", "x", 0, 1, "s")
    assert f.of(ok) is None
    assert f.of(replace(ok, attributes={"output.value": "Oops, it broke"})) == "oops"
    assert f.of(replace(ok, status="Error", status_message="ValueError: bad")) == "valueerror"
    typed = replace(
        ok, status="Error", events=(SpanEvent("exception", 0, {"exception.type": "a.b.KeyError"}),)
    )
    assert f.of(typed) == "keyerror"


def test_a_new_framework_is_a_table_without_a_workflow_span():
    """A dialect with no workflow span: the task is the trace, the run ends with its root."""
    d = Dialect(
        rule="example.handoff",
        scope="example",
        handoffs=(Handoff(Spans("example", names=("transfer",))),),
        target=(Find(Read("args", path=("to",))),),
        source=(Find(Read("agent"), "ancestor", Spans("example", names=("agent",))),),
        outcome=NextRun(Spans("example", names=("agent",)), agent=(Find(Read("agent")),)),
    )
    spans = [
        span("00000000000000a1", "", "root", 0, 40, "example"),
        span("00000000000000b1", "00000000000000a1", "agent", 1, 10, "example", agent="a"),
        span("00000000000000b2", "00000000000000b1", "transfer", 2, 3, "example", args='{"to": "b"}'),
        span("00000000000000c1", "00000000000000a1", "agent", 11, 20, "example", agent="b"),
    ]  # fmt: skip
    (o,) = observe(TraceIndex(spans), d)
    assert (o.from_agent, o.to_agent, o.task_id, o.run_ended_ns) == ("a", "b", T, 40 * MS)
    assert o.target is not None and o.target.span.span_id == "00000000000000c1"
