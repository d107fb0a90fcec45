"""The Strands Agents rule on plain span records, shaped as Strands' tracer records a Swarm
(scope `strands.telemetry.tracer`, node runs as sibling `invoke_agent` spans under
`invoke_swarm`, whose status stays Unset when a node failed; the handoff's target only in the
tool's input)."""

from __future__ import annotations

from dataclasses import replace

from derive import SpanEvent, SpanRecord, derive_trace, new_transitions
from derive.strands import STRANDS, STRANDS_SCOPE, handoff_target

T = "0af7651916cd43dd8448eb211c80319c"
MS = 1_000_000
SW = "00000000000000a1"


def span(sid, parent, name, start, end, status="Ok", events=(), **attrs):
    return SpanRecord(
        trace_id=T, span_id=sid, parent_span_id=parent, name=name, start_ns=start * MS,
        end_ns=end * MS, status=status, scope=STRANDS_SCOPE, service_name="app",
        attributes={k.replace("__", "."): v for k, v in attrs.items()}, events=events,
    )  # fmt: skip


def swarm(end=100):
    return span(SW, "", "invoke_swarm", 0, end, status="Unset",
                gen_ai__operation__name="invoke_swarm")  # fmt: skip


def node(sid, agent, start, end, **kw):
    return span(sid, SW, f"invoke_agent {agent}", start, end,
                gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent, **kw)  # fmt: skip


def chat(sid, parent, start, end, **kw):
    return span(sid, parent, "chat", start, end, gen_ai__operation__name="chat", **kw)


def handoff(sid, parent, start, target, how="event"):
    """`how`: where the target is named: "event" (Strands' default), "args" (latest
    conventions) or "none" (content not stored)."""
    args = f'{{"agent_name": "{target}", "message": "over to {target}"}}'
    attrs: dict[str, str] = {}
    events: tuple[SpanEvent, ...] = ()
    if how == "args":
        attrs = {"gen_ai__tool__call__arguments": args}
    elif how == "event":
        events = (SpanEvent("gen_ai.tool.message", start * MS, {"role": "tool", "content": args}),)
    return span(sid, parent, "execute_tool handoff_to_agent", start, start + 1, events=events,
                gen_ai__operation__name="execute_tool", gen_ai__tool__name="handoff_to_agent",
                **attrs)  # fmt: skip


def bounce(how="event"):
    """triage -> refund -> triage, each node's run after the one before."""
    return [
        node("00000000000000b1", "triage", 1, 10),
        chat("00000000000000b2", "00000000000000b1", 2, 5),
        handoff("00000000000000b3", "00000000000000b1", 6, "refund", how),
        chat("00000000000000b4", "00000000000000b1", 7, 9),
        node("00000000000000d1", "refund", 11, 20),
        chat("00000000000000d2", "00000000000000d1", 12, 15),
        handoff("00000000000000d3", "00000000000000d1", 16, "triage", how),
        node("00000000000000e1", "triage", 21, 30),
        chat("00000000000000e2", "00000000000000e1", 22, 28),
    ]


def events(derived):
    return [(d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
            for d in derived]  # fmt: skip


COMMITTED_BOUNCE = [
    ("create", "triage", None), ("accept", "refund", None), ("start", "refund", None),
    ("prepare", "refund", None), ("commit", "refund", None),
    ("create", "refund", None), ("accept", "triage", None), ("start", "triage", None),
    ("prepare", "triage", None), ("commit", "triage", None),
]  # fmt: skip


def test_a_bounce_is_two_committed_transfers_with_the_second_caused_by_the_first():
    out = derive_trace([swarm(), *bounce()])
    assert events(out) == COMMITTED_BOUNCE
    first, second = out[0], out[5]
    assert {d.attr("handoff.derived_by") for d in out} == {STRANDS}
    assert first.attr("handoff.handoff_id") == f"{T}/00000000000000b3"
    assert first.attr("handoff.task_id") == f"{T}/{SW}" == second.attr("handoff.task_id")
    assert first.attr("handoff.mode") == "transfer"
    assert second.attr("handoff.causation_id") == first.attr("handoff.handoff_id")
    assert out[3].attr("handoff.evidence_refs") == ("strands:00000000000000d2",)
    assert out[4].attr("handoff.execution.id") == "00000000000000d1"
    assert [d.time_ns for d in out[:5]] == sorted(d.time_ns for d in out[:5])


def test_the_target_from_arguments_event_or_next_run_gives_the_same_transitions():
    runs = [derive_trace([swarm(), *bounce(how)]) for how in ("event", "args", "none")]
    assert [(d.span_id, d.attributes) for d in runs[0]] == [
        (d.span_id, d.attributes) for d in runs[1]
    ] == [(d.span_id, d.attributes) for d in runs[2]]  # fmt: skip
    assert handoff_target(bounce("event")[2]) == "refund"
    assert handoff_target(bounce("args")[2]) == "refund"
    assert handoff_target(bounce("none")[2]) is None
    bad = replace(bounce("none")[2], attributes={"gen_ai.tool.call.arguments": "not json"})
    assert handoff_target(bad) is None


def test_a_failed_node_fails_the_handoff_though_the_swarm_is_unset():
    boom = SpanEvent("exception", 15 * MS, {"exception.type": "openai.InternalServerError"})
    msg = "Error code: 500 - {'error': {'message': 'scripted failure'}}"
    spans = [*bounce()[:4], replace(bounce()[4], status="Error", status_message=msg,
                                    events=(boom,)),
             replace(bounce()[5], status="Error", status_message=msg, events=(boom,))]  # fmt: skip
    out = derive_trace([swarm(), *spans])
    assert events(out) == [*COMMITTED_BOUNCE[:3], ("fail", "refund", "internal_server_error")]
    # only the model call in Error (the node's run Unset): a failed execution still
    quiet = [*spans[:4], replace(bounce()[4], status="Unset"), spans[5]]
    assert events(derive_trace([swarm(), *quiet]))[-1] == (
        "fail", "refund", "internal_server_error"
    )  # fmt: skip


def test_without_a_named_target_nothing_is_guessed_before_the_next_run_is_stored():
    spans = bounce("none")[:4]
    assert derive_trace(spans) == []
    assert events(derive_trace([swarm(), *spans])) == [
        ("create", "triage", None), ("reject", "triage", "handoff_target_unresolved"),
    ]  # fmt: skip
    named = bounce("event")[:4]
    assert events(derive_trace(named)) == [("create", "triage", None)]
    assert events(derive_trace([swarm(), *named]))[-1] == (
        "fail", "refund", "run_ended_before_target_finished"
    )  # fmt: skip


def test_a_failed_handoff_call_and_other_scopes_are_not_read():
    failed = replace(bounce()[2], status="Error", status_message="Agent 'x' not found")
    assert derive_trace([swarm(), *bounce()[:2], failed, bounce()[3], bounce()[4]]) == []
    assert derive_trace([replace(s, scope="other") for s in [swarm(), *bounce()]]) == []


def test_resent_spans_derive_nothing_twice():
    spans = [swarm(), *bounce()]
    first = new_transitions(spans)
    stored = [
        SpanRecord(T, d.span_id, d.parent_span_id, d.name, d.time_ns, d.time_ns,
                   attributes={k: str(v) for k, v in d.attributes})
        for d in first
    ]  # fmt: skip
    assert len(first) == 10 and new_transitions(spans + spans + stored) == []


def test_the_task_is_the_swarm_before_and_after_its_span_is_stored():
    """The swarm's span ends last, so early passes read the nodes without it: the task id
    (the swarm's span id, from the node run's parent) must not change when it arrives."""
    from derive._model import SpanRecord
    from derive._trace import TraceIndex
    from derive.strands import strands_rule

    def span(sid, parent, name, start, end, **attrs):
        return SpanRecord(
            trace_id="tr",
            span_id=sid,
            parent_span_id=parent,
            name=name,
            start_ns=start,
            end_ns=end,
            scope="strands.telemetry.tracer",
            attributes=attrs,
        )

    op = "gen_ai.operation.name"
    nodes = [
        span("a", "sw", "invoke_agent triage", 1, 10, **{op: "invoke_agent", "gen_ai.agent.name": "triage"}),
        span("h", "a", "execute_tool handoff_to_agent", 8, 9, **{op: "execute_tool",
             "gen_ai.tool.name": "handoff_to_agent",
             "gen_ai.tool.call.arguments": '{"agent_name": "billing"}'}),
        span("b", "sw", "invoke_agent billing", 11, 20, **{op: "invoke_agent", "gen_ai.agent.name": "billing"}),
    ]  # fmt: skip
    swarm = span("sw", "", "invoke_swarm", 0, 21, **{op: "invoke_swarm"})
    before = {o.task_id for o in strands_rule(TraceIndex(nodes))}
    after = {o.task_id for o in strands_rule(TraceIndex([*nodes, swarm]))}
    assert before == after == {"tr/sw"}
