"""The Google ADK rule on plain span records, shaped as ADK's own tracer records them
(scope `gcp.vertex.agent`, status Unset on success, the transfer's target only in captured
arguments)."""

from __future__ import annotations

from dataclasses import replace

from derive import SpanEvent, SpanRecord, derive_trace, new_transitions
from derive.adk import ADK, ADK_SCOPE, transfer_target

T = "1af7651916cd43dd8448eb211c80319c"
MS = 1_000_000
WF = "00000000000000a1"


def span(sid, parent, name, start, end, status="Unset", **attrs):
    return SpanRecord(
        trace_id=T,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        start_ns=start * MS,
        end_ns=end * MS,
        status=status,
        scope=ADK_SCOPE,
        service_name="app",
        attributes={k.replace("__", "."): v for k, v in attrs.items()},
    )


def workflow(end=100):
    return span(WF, "", "invoke_workflow triage", 0, end, gen_ai__operation__name="invoke_workflow")


def invoke(sid, agent, start, end, **kw):
    return span(sid, WF, f"invoke_agent {agent}", start, end, gen_ai__operation__name="invoke_agent",
                gen_ai__agent__name=agent, **kw)  # fmt: skip


def model(sid, parent, agent, start, end, **kw):
    return span(sid, parent, f"generate_content {agent}", start, end,
                gen_ai__operation__name="generate_content", gen_ai__agent__name=agent, **kw)  # fmt: skip


def transfer(sid, parent, agent, start, target=None):
    args = {"gen_ai__tool__call__arguments": f'{{"agent_name": "{target}"}}'} if target else {}
    return span(sid, parent, "execute_tool transfer_to_agent", start, start + 1,
                gen_ai__operation__name="execute_tool", gen_ai__tool__name="transfer_to_agent",
                gen_ai__tool__type="TransferToAgentTool", gen_ai__agent__name=agent, **args)  # fmt: skip


def bounce(targets=False):
    """triage -> coder -> triage, content capture off unless `targets`."""
    return [
        invoke("00000000000000b1", "triage", 1, 10),
        model("00000000000000b2", "00000000000000b1", "triage", 2, 8),
        transfer("00000000000000b3", "00000000000000b1", "triage", 8, "coder" if targets else None),
        invoke("00000000000000d1", "coder", 11, 20),
        model("00000000000000d2", "00000000000000d1", "coder", 12, 18),
        transfer(
            "00000000000000d3", "00000000000000d1", "coder", 18, "triage" if targets else None
        ),
        invoke("00000000000000e1", "triage", 21, 30),
        model("00000000000000e2", "00000000000000e1", "triage", 22, 28),
    ]


def events(derived):
    return [(d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
            for d in derived]  # fmt: skip


COMMITTED_BOUNCE = [
    ("create", "triage", None), ("accept", "coder", None), ("start", "coder", None),
    ("prepare", "coder", None), ("commit", "coder", None),
    ("create", "coder", None), ("accept", "triage", None), ("start", "triage", None),
    ("prepare", "triage", None), ("commit", "triage", None),
]  # fmt: skip


def test_a_bounce_without_content_capture_reads_targets_from_the_next_agent_run():
    out = derive_trace([workflow(), *bounce()])
    assert events(out) == COMMITTED_BOUNCE
    create = out[0]
    assert create.attr("handoff.derived_by") == ADK
    assert (
        create.attr("handoff.to_agent") == "coder" and out[5].attr("handoff.to_agent") == "triage"
    )
    assert create.attr("handoff.task_id") == f"{T}/{WF}" == out[5].attr("handoff.task_id")
    assert create.attr("handoff.handoff_id") == f"{T}/00000000000000b3"
    assert out[5].attr("handoff.causation_id") == create.attr("handoff.handoff_id")
    # ADK leaves success Unset: the target's run commits, its model call is the evidence
    assert out[3].attr("handoff.evidence_refs") == ("adk:00000000000000d2",)
    assert out[4].attr("handoff.execution.id") == "00000000000000d1"


def test_captured_arguments_name_the_target_and_give_the_same_transitions():
    plain, named = derive_trace([workflow(), *bounce()]), derive_trace([workflow(), *bounce(True)])
    assert [(d.span_id, d.attributes) for d in plain] == [(d.span_id, d.attributes) for d in named]
    assert transfer_target(bounce(True)[2]) == "coder"
    legacy = span("0000000000000001", "", "execute_tool transfer_to_agent", 0, 1,
                  gcp__vertex__agent__tool_call_args='{"agent_name": "x"}')  # fmt: skip
    assert transfer_target(legacy) == "x"
    for raw in ("{}", "not json", '["agent_name"]', '{"agent_name": 3}'):
        assert (
            transfer_target(replace(legacy, attributes={"gen_ai.tool.call.arguments": raw})) is None
        )


def test_without_capture_nothing_is_guessed_before_the_next_run_is_stored():
    spans = bounce()[:3]  # the transfer and its source run; the target's run not stored yet
    assert derive_trace(spans) == []
    # the workflow ended without another agent run: the target is never known
    assert events(derive_trace([workflow(), *spans])) == [
        ("create", "triage", None), ("reject", "triage", "handoff_target_unresolved"),
    ]  # fmt: skip
    # with the target named, the create comes at once, the failure when the workflow ended
    named = bounce(True)[:3]
    assert events(derive_trace(named)) == [("create", "triage", None)]
    assert events(derive_trace([workflow(), *named]))[-1] == (
        "fail", "coder", "run_ended_before_target_finished"
    )  # fmt: skip


def test_a_failing_target_fails_the_handoff_with_its_exception_type():
    boom = SpanEvent("exception", 15 * MS, {"exception.type": "RuntimeError"})
    spans = [*bounce()[:3], replace(bounce()[3], status="Error", events=(boom,)),
             replace(bounce()[4], status="Error")]  # fmt: skip
    out = derive_trace([replace(workflow(), status="Error"), *spans])
    assert events(out)[-1] == ("fail", "coder", "runtimeerror")
    assert events(out)[:3] == COMMITTED_BOUNCE[:3]


def test_a_failed_transfer_call_is_not_a_handoff():
    spans = [*bounce()[:2], replace(bounce()[2], status="Error"), *bounce()[3:5]]
    assert derive_trace([workflow(), *spans]) == []


def test_other_scopes_and_other_tools_are_not_read():
    other_tool = replace(bounce()[2], attributes={**bounce()[2].attributes,
                                                  "gen_ai.tool.name": "search"})  # fmt: skip
    assert derive_trace([workflow(), *bounce()[:2], other_tool, *bounce()[3:5]]) == []
    foreign = [replace(s, scope="other") for s in bounce()]
    assert derive_trace([workflow(), *foreign]) == []


def test_resent_spans_derive_nothing_twice():
    spans = [workflow(), *bounce()]
    first = new_transitions(spans)
    stored = [
        SpanRecord(T, d.span_id, d.parent_span_id, d.name, d.time_ns, d.time_ns,
                   attributes={k: str(v) for k, v in d.attributes})
        for d in first
    ]  # fmt: skip
    assert new_transitions(spans + spans + stored) == []


def test_the_task_is_the_workflow_before_and_after_its_span_is_stored():
    """The workflow's span ends last, so early passes read the agent runs without it: the
    task id (the workflow's span id, from the run's parent) must not change when it arrives."""
    from derive._model import SpanRecord
    from derive._trace import TraceIndex
    from derive.adk import adk_rule

    op = "gen_ai.operation.name"

    def span(sid, parent, name, start, end, **attrs):
        return SpanRecord(
            trace_id="tr", span_id=sid, parent_span_id=parent, name=name, start_ns=start,
            end_ns=end, scope="gcp.vertex.agent", attributes=attrs,
        )  # fmt: skip

    runs = [
        span("a", "wf", "invoke_agent triage", 1, 10,
             **{op: "invoke_agent", "gen_ai.agent.name": "triage"}),
        span("h", "a", "execute_tool transfer_to_agent", 8, 9,
             **{op: "execute_tool", "gen_ai.tool.name": "transfer_to_agent",
                "gen_ai.tool.call.arguments": '{"agent_name": "coder"}'}),
        span("b", "wf", "invoke_agent coder", 11, 20,
             **{op: "invoke_agent", "gen_ai.agent.name": "coder"}),
    ]  # fmt: skip
    workflow = span("wf", "", "invoke_workflow triage", 0, 21, **{op: "invoke_workflow"})
    before = {o.task_id for o in adk_rule(TraceIndex(runs))}
    after = {o.task_id for o in adk_rule(TraceIndex([*runs, workflow]))}
    assert before == after == {"tr/wf"}
