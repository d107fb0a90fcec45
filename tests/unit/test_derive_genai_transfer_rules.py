"""The GenAI rule on the agent-to-agent transfer attributes under review (`gen_ai.transfer.*`
on `execute_tool`, `gen_ai.caller.*` on `invoke_agent`), on plain span records."""

from __future__ import annotations

from derive import SpanRecord, derive_trace
from derive.genai import GENAI

T = "4af7651916cd43dd8448eb211c80319c"
MS = 1_000_000
ROOT = "00000000000000a1"


def span(sid, parent, name, start, end, status="Unset", **attrs):
    return SpanRecord(
        trace_id=T,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        start_ns=start * MS,
        end_ns=end * MS,
        status=status,
        scope="any",
        service_name="app",
        attributes={k.replace("__", "."): v for k, v in attrs.items()},
    )


def root(end=100):
    return span(ROOT, "", "conversation", 0, end)


def invoke(sid, agent, start, end, status="Unset", **kw):
    return span(sid, ROOT, f"invoke_agent {agent}", start, end, status,
                gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent, **kw)  # fmt: skip


def chat(sid, parent, start, end):
    return span(sid, parent, "chat m", start, end, gen_ai__operation__name="chat")


def tool(sid, parent, start, name="route", **kw):
    return span(sid, parent, f"execute_tool {name}", start, start + 1,
                gen_ai__operation__name="execute_tool", gen_ai__tool__name=name, **kw)  # fmt: skip


def transfer(target, mode="pass_control", kind="agent"):
    return tool("00000000000000b2", "00000000000000b1", 5, gen_ai__transfer__mode=mode,
                gen_ai__transfer__target__name=target, gen_ai__transfer__target__type=kind)  # fmt: skip


def triage():
    return invoke("00000000000000b1", "triage", 1, 10)


def events(derived):
    return [(d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
            for d in derived]  # fmt: skip


def billing(sid="00000000000000d1", start=11, **kw):
    return invoke(sid, "billing", start, start + 9, **kw)


def test_pass_control_is_a_transfer_to_the_target_agents_run():
    out = derive_trace([root(), triage(), transfer("billing"), billing(),
                        chat("00000000000000d2", "00000000000000d1", 12, 18)])  # fmt: skip
    assert [e for e, _, _ in events(out)] == ["create", "accept", "start", "prepare", "commit"]
    create = out[0]
    assert (create.attr("handoff.mode"), create.attr("handoff.derived_by")) == ("transfer", GENAI)
    assert (create.attr("handoff.from_agent"), create.attr("handoff.to_agent")) == (
        "triage",
        "billing",
    )
    assert out[3].attr("handoff.evidence_refs") == ("genai:00000000000000d2",)
    assert out[4].attr("handoff.execution.id") == "00000000000000d1"


def test_return_to_caller_is_a_delegation():
    out = derive_trace([root(), triage(), transfer("billing", "return_to_caller"), billing()])
    assert out[0].attr("handoff.mode") == "delegate"
    assert events(out)[-1] == ("commit", "billing", None)


def test_a_transfer_to_a_human_is_an_escalation():
    out = derive_trace([root(), triage(), transfer("support-desk", kind="human")])
    assert events(out) == [("create", "triage", None), ("escalate", "triage", None)]
    assert out[0].attr("handoff.mode") == "escalate"
    assert out[0].attr("handoff.to_agent") == "support-desk"
    assert out[-1].attr("handoff.to_state") == "escalated"
    # no agent run of that name is ever taken as the human's
    named_like_an_agent = [root(), triage(), transfer("billing", kind="human"), billing()]
    assert [e for e, _, _ in events(derive_trace(named_like_an_agent))] == ["create", "escalate"]


def test_a_transfer_to_a_workflow_is_run_by_its_invoke_workflow_span():
    flow = span("00000000000000d1", ROOT, "invoke_workflow refunds", 11, 20,
                gen_ai__operation__name="invoke_workflow", gen_ai__workflow__name="refunds")  # fmt: skip
    out = derive_trace([root(), triage(), transfer("refunds", kind="workflow"), flow])
    assert events(out)[-1] == ("commit", "refunds", None)
    assert out[-1].attr("handoff.execution.id") == "00000000000000d1"
    # an agent run of the same name is not the workflow's
    agent = invoke("00000000000000d1", "refunds", 11, 20)
    out = derive_trace([root(), triage(), transfer("refunds", kind="workflow"), agent])
    assert events(out)[-1] == ("fail", "refunds", "run_ended_before_target_finished")


def test_the_caller_named_on_invoke_agent_picks_the_run():
    other = billing("00000000000000d1", 11, gen_ai__caller__type="agent",
                    gen_ai__caller__name="intake")  # fmt: skip
    mine = billing("00000000000000e1", 21, gen_ai__caller__type="agent",
                   gen_ai__caller__name="triage")  # fmt: skip
    out = derive_trace([root(), triage(), transfer("billing"), other, mine])
    assert out[-1].attr("handoff.execution.id") == "00000000000000e1"
    # a run naming another caller is never taken; one naming none is
    out = derive_trace([root(), triage(), transfer("billing"), other])
    assert events(out)[-1] == ("fail", "billing", "run_ended_before_target_finished")
    out = derive_trace(
        [root(), triage(), transfer("billing"), other, billing("00000000000000f1", 30)]
    )
    assert out[-1].attr("handoff.execution.id") == "00000000000000f1"


def test_a_tool_name_alone_is_no_transfer():
    spans = [root(), triage(), tool("00000000000000b2", "00000000000000b1", 5,
                                    name="transfer_to_billing"), billing()]  # fmt: skip
    assert derive_trace(spans) == []


def test_both_proposals_on_one_span_derive_one_handoff():
    both = tool("00000000000000b2", "00000000000000b1", 5, gen_ai__transfer__mode="pass_control",
                gen_ai__transfer__target__name="billing", gen_ai__transfer__target__type="agent",
                gen_ai__agent__handoff__source__name="triage",
                gen_ai__agent__handoff__target__name="billing")  # fmt: skip
    out = derive_trace([root(), triage(), both, billing()])
    assert [d.attr("handoff.to_agent") for d in out if d.attr("handoff.event") == "create"] == [
        "billing"
    ]
    assert events(out)[-1] == ("commit", "billing", None)


def test_derived_escalations_pass_ingest_validation():
    from derive import encode
    from ingest import decode_request

    derived = derive_trace([root(), triage(), transfer("support-desk", kind="human")])
    batch = decode_request(encode(derived), "protobuf", tenant="acme")
    assert (batch.spans, batch.stored, batch.rejects, batch.flagged) == (2, 2, [], 0)
