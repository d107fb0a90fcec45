"""The Microsoft Agent Framework rule on plain span records, shaped as the framework's own
tracer records a `HandoffBuilder` workflow (scope `agent_framework`, status Unset on success,
the handoff a `message.send` joined to its delivery and to the target's run by span links)."""

from __future__ import annotations

from dataclasses import replace

from derive import SpanEvent, SpanRecord, derive_trace, new_transitions
from derive.agent_framework import AGENT_FRAMEWORK, AGENT_FRAMEWORK_SCOPE

T = "2af7651916cd43dd8448eb211c80319c"
MS = 1_000_000
ROOT = "00000000000000a0"
WF = "00000000000000a1"


def span(sid, parent, name, start, end, status="Unset", links=(), **attrs):
    return SpanRecord(
        trace_id=T,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        start_ns=start * MS,
        end_ns=end * MS,
        status=status,
        scope=AGENT_FRAMEWORK_SCOPE,
        service_name="app",
        attributes={k.replace("__", "."): v for k, v in attrs.items()},
        links=tuple((T, s) for s in links),
    )


def root(end=100):
    return replace(span(ROOT, "", "request", 0, end), scope="support-app")


def workflow(end=99):
    return span(WF, ROOT, "invoke_workflow support", 0, end,
                gen_ai__operation__name="invoke_workflow", gen_ai__workflow__name="support")  # fmt: skip


def executor(sid, agent, start, end, links=(), status="Unset", **kw):
    return span(sid, WF, f"executor.process {agent}", start, end, status, links,
                executor__id=agent, executor__type="HandoffAgentExecutor", **kw)  # fmt: skip


def agent_run(sid, parent, agent, start, end, status="Unset", **kw):
    return span(sid, parent, f"invoke_agent {agent}", start, end, status,
                gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent, **kw)  # fmt: skip


def chat(sid, parent, agent, start, end, status="Unset", **kw):
    return span(sid, parent, f"chat {agent}", start, end, status, gen_ai__operation__name="chat",
                **kw)  # fmt: skip


def send(sid, parent, at, to=None):
    extra = {"message__destination_executor_id": to} if to else {}
    return span(sid, parent, "message.send", at, at, message__type="AgentExecutorRequest",
                **extra)  # fmt: skip


def edge(sid, source, at, link, to=None, delivered="True", status="delivered"):
    extra = {"message__target_id": to} if to else {}
    return span(sid, WF, "edge_group.process FanOutEdgeGroup", at, at + 1, links=(link,),
                edge_group__type="FanOutEdgeGroup", message__source_id=source,
                edge_group__delivered=delivered, edge_group__delivery_status=status, **extra)  # fmt: skip


def hop(n, src_exec, src, dst, at, other):
    """`src` (running in executor span `src_exec`) broadcasts to `dst` and `other`, then hands
    off to `dst`: sends, edge groups and the executor spans they reach (the target's run not
    included). n: a digit keeping span ids apart."""
    b, h = f"00000000000{n}00b0", f"00000000000{n}00c0"
    return [
        send(b, src_exec, at),
        send(h, src_exec, at + 1, to=dst),
        edge(f"00000000000{n}00b1", src, at + 2, b),
        executor(f"00000000000{n}00b2", dst, at + 2, at + 3, links=(b,)),  # broadcast: no run
        executor(f"00000000000{n}00b3", other, at + 2, at + 3, links=(b,)),
        edge(f"00000000000{n}00c1", src, at + 4, h, to=dst),
    ]


def triage_to_billing(billing_status="Unset"):
    return [
        root(),
        workflow(),
        executor("00000000000000e1", "triage", 1, 10),
        agent_run("00000000000000e2", "00000000000000e1", "triage", 2, 8),
        chat("00000000000000e3", "00000000000000e2", "triage", 3, 7),
        *hop(1, "00000000000000e1", "triage", "billing", 8, "refund"),
        executor(
            "00000000000000f1",
            "billing",
            14,
            30,
            links=("00000000000100c0",),
            status=billing_status,
            **({"error__type": "ChatClientException"} if billing_status == "Error" else {}),
        ),
        agent_run("00000000000000f2", "00000000000000f1", "billing", 15, 29, billing_status),
        chat("00000000000000f3", "00000000000000f2", "billing", 16, 28, billing_status),
    ]


def events(derived):
    return [(d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
            for d in derived]  # fmt: skip


COMMITTED = [
    ("create", "triage", None), ("accept", "billing", None), ("start", "billing", None),
    ("prepare", "billing", None), ("commit", "billing", None),
]  # fmt: skip


def test_an_addressed_send_is_a_handoff_to_the_executor_run_linked_to_it():
    out = derive_trace(triage_to_billing())
    assert events(out) == COMMITTED
    create, prepare = out[0], out[3]
    assert create.attr("handoff.derived_by") == AGENT_FRAMEWORK
    assert create.attr("handoff.handoff_id") == f"{T}/00000000000100c0"
    assert create.attr("handoff.task_id") == f"{T}/{WF}"
    assert (create.attr("handoff.from_agent"), create.attr("handoff.to_agent")) == (
        "triage",
        "billing",
    )
    assert (create.attr("handoff.mode"), create.attr("handoff.topology")) == (
        "transfer",
        "in_process",
    )
    # the run linked to the addressed send, not the broadcast one before it
    assert prepare.attr("handoff.execution.id") == "00000000000000f1"
    assert prepare.attr("handoff.evidence_refs") == ("agent_framework:00000000000000f3",)
    assert prepare.attr("handoff.evidence.count") == 1


def test_broadcast_sends_and_the_runs_they_reach_are_no_handoffs():
    spans = [s for s in triage_to_billing() if s.span_id not in {"00000000000100c0"}]
    assert derive_trace(spans) == []


def test_a_failing_target_run_fails_the_handoff_with_its_error_type():
    out = derive_trace(triage_to_billing("Error"))
    assert events(out)[-1] == ("fail", "billing", "chatclientexception")
    assert out[-1].attr("handoff.execution.id") == "00000000000000f1"
    # the type from the exception event when neither description nor error.type says it
    spans = [
        replace(s, attributes={k: v for k, v in s.attributes.items() if k != "error.type"},
                events=(SpanEvent("exception", 0, {"exception.type": "Boom"}),))
        if s.span_id == "00000000000000f1" else s
        for s in triage_to_billing("Error")
    ]  # fmt: skip
    assert events(derive_trace(spans))[-1] == ("fail", "billing", "boom")


def test_the_handoff_waits_for_the_target_run_and_fails_when_the_workflow_ended_without_it():
    spans = triage_to_billing()
    running = [s for s in spans if s.span_id not in {"00000000000000f1", "00000000000000f2",
                                                     "00000000000000f3", WF, ROOT}]  # fmt: skip
    (create,) = derive_trace(running)
    assert events([create]) == [("create", "triage", None)]
    # the task is the workflow run, named before its span (it ends last) is stored
    assert create.attr("handoff.task_id") == f"{T}/{WF}"
    ended = [s for s in spans if s.span_id not in {"00000000000000f1", "00000000000000f2",
                                                   "00000000000000f3"}]  # fmt: skip
    assert events(derive_trace(ended))[-1] == (
        "fail", "billing", "run_ended_before_target_finished"
    )  # fmt: skip


def test_a_send_not_delivered_is_rejected_with_the_delivery_status():
    spans = [
        replace(s, attributes={**s.attributes, "edge_group.delivered": "False",
                               "edge_group.delivery_status": "dropped_type_mismatch"})
        if s.span_id == "00000000000100c1" else s
        for s in triage_to_billing()
        if s.span_id not in {"00000000000000f1", "00000000000000f2", "00000000000000f3"}
    ]  # fmt: skip
    assert events(derive_trace(spans)) == [
        ("create", "triage", None), ("reject", "billing", "dropped_type_mismatch"),
    ]  # fmt: skip


def test_a_link_into_another_trace_is_not_followed():
    spans = [
        replace(s, links=(("3" + T[1:], "00000000000100c0"),)) if s.span_id == "00000000000000f1"
        else s
        for s in triage_to_billing()
    ]  # fmt: skip
    assert events(derive_trace(spans))[-1] == (
        "fail", "billing", "run_ended_before_target_finished"
    )  # fmt: skip


def test_a_bounce_names_the_first_handoff_as_the_cause_of_the_second():
    spans = [
        root(),
        workflow(),
        executor("00000000000000e1", "triage", 1, 10),
        agent_run("00000000000000e2", "00000000000000e1", "triage", 2, 8),
        *hop(1, "00000000000000e1", "triage", "refund", 8, "billing"),
        executor("00000000000000f1", "refund", 14, 30, links=("00000000000100c0",)),
        agent_run("00000000000000f2", "00000000000000f1", "refund", 15, 25),
        *hop(2, "00000000000000f1", "refund", "triage", 25, "billing"),
        executor("0000000000000101", "triage", 31, 40, links=("00000000000200c0",)),
        agent_run("0000000000000102", "0000000000000101", "triage", 32, 39),
        chat("0000000000000103", "0000000000000102", "triage", 33, 38),
    ]
    out = derive_trace(spans)
    assert [(d.attr("handoff.from_agent"), d.attr("handoff.to_agent"))
            for d in out if d.attr("handoff.event") == "create"] == [
        ("triage", "refund"), ("refund", "triage"),
    ]  # fmt: skip
    assert [e for e, _, _ in events(out)].count("commit") == 2
    assert out[5].attr("handoff.causation_id") == f"{T}/00000000000100c0"
    # refund's run had no model call that ended: its commit shows no evidence
    assert out[3].attr("handoff.evidence.valid") is False


def test_ids_are_deterministic_and_stored_ones_are_not_derived_again():
    spans = triage_to_billing()
    first = derive_trace(spans)
    assert derive_trace(list(reversed(spans))) == first
    stored = [
        SpanRecord(trace_id=d.trace_id, span_id=d.span_id, parent_span_id=d.parent_span_id,
                   name=d.name, start_ns=d.time_ns, end_ns=d.time_ns,
                   attributes={k: str(v) for k, v in d.attributes})
        for d in first
    ]  # fmt: skip
    assert new_transitions([*spans, *stored]) == []


def test_spans_of_another_scope_are_not_read():
    spans = [replace(s, scope="other") for s in triage_to_billing()]
    assert derive_trace(spans) == []


def test_derived_spans_pass_ingest_validation_as_legal_transitions():
    from derive import encode
    from ingest import decode_request

    derived = derive_trace(triage_to_billing())
    batch = decode_request(encode(derived), "protobuf", tenant="acme")
    assert (batch.spans, batch.stored, batch.rejects, batch.flagged) == (5, 5, [], 0)
