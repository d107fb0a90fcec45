"""The derivation rules on plain span records: what each source's spans become."""

from __future__ import annotations

from derive import SpanRecord, derive_trace, new_transitions
from derive._trace import requested_agents, sdk_error_message
from derive.genai import GENAI
from derive.openai_agents import OPENINFERENCE, OPENLLMETRY

T = "0af7651916cd43dd8448eb211c80319c"
OI = "openinference.instrumentation.openai_agents"
TL = "opentelemetry.instrumentation.openai_agents"
MS = 1_000_000


def span(sid, parent, name, start, end, scope=OI, status="Ok", message="", **attrs):
    return SpanRecord(
        trace_id=T,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        start_ns=start * MS,
        end_ns=end * MS,
        status=status,
        status_message=message,
        scope=scope,
        service_name="app",
        attributes={k.replace("__", "."): v for k, v in attrs.items()},
    )


def oi_agent(sid, name, start, end, **kw):
    return span(sid, "00000000000000c1", name, start, end, openinference__span__kind="AGENT",
                agent__name=name, **kw)  # fmt: skip


def oi_turn(sid, parent, start, end):
    return span(sid, parent, "turn", start, end, openinference__span__kind="CHAIN")


def oi_llm(sid, parent, start, end, **kw):
    return span(sid, parent, "generation", start, end, openinference__span__kind="LLM", **kw)


def oi_handoff(sid, parent, src, dst, at, **kw):
    return span(sid, parent, f"handoff to {dst}", at, at + 1, openinference__span__kind="TOOL",
                input__value=src, output__value=dst, **kw)  # fmt: skip


def oi_workflow(end):
    return span("00000000000000c1", "00000000000000a1", "Agent workflow", 0, end,
                openinference__span__kind="CHAIN")  # fmt: skip


def events(derived):
    return [
        (d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
        for d in derived
    ]


def oi_bounce():
    """planner -> coder -> planner (a transfer handed straight back)."""
    return [
        oi_agent("00000000000000b1", "planner", 1, 10),
        oi_turn("00000000000000b2", "00000000000000b1", 2, 9),
        oi_llm("00000000000000b3", "00000000000000b2", 2, 8),
        oi_handoff("00000000000000b4", "00000000000000b2", "planner", "coder", 8),
        oi_agent("00000000000000d1", "coder", 11, 20),
        oi_turn("00000000000000d2", "00000000000000d1", 12, 19),
        oi_llm("00000000000000d3", "00000000000000d2", 12, 18),
        oi_handoff("00000000000000d4", "00000000000000d2", "coder", "planner", 18),
        oi_agent("00000000000000e1", "planner", 21, 30),
        oi_turn("00000000000000e2", "00000000000000e1", 22, 29),
        oi_llm("00000000000000e3", "00000000000000e2", 22, 28),
    ]


def test_openinference_bounce_is_two_committed_transfers():
    out = derive_trace(oi_bounce())
    assert events(out) == [
        ("create", "planner", None), ("accept", "coder", None), ("start", "coder", None),
        ("prepare", "coder", None), ("commit", "coder", None),
        ("create", "coder", None), ("accept", "planner", None), ("start", "planner", None),
        ("prepare", "planner", None), ("commit", "planner", None),
    ]  # fmt: skip
    create = out[0]
    assert create.attr("handoff.from_agent") == "planner"
    assert create.attr("handoff.to_agent") == "coder"
    assert create.attr("handoff.mode") == "transfer"
    assert create.attr("handoff.derived_by") == OPENINFERENCE
    assert create.attr("handoff.task_id") == out[5].attr("handoff.task_id")  # one run, one task
    # made by the first handoff's target: it hands that handoff's result on
    assert create.attr("handoff.causation_id") is None
    assert out[5].attr("handoff.causation_id") == create.attr("handoff.handoff_id")
    assert create.time_ns == 8 * MS and out[1].time_ns == 9 * MS and out[4].time_ns == 20 * MS
    assert out[3].attr("handoff.evidence.count") == 2  # the coder's turn and model call
    assert out[3].attr("handoff.evidence.valid") is True
    assert out[4].attr("handoff.execution.id") == "00000000000000d1"
    assert all(d.trace_id == T for d in out)


def test_ids_are_deterministic_and_stored_ones_are_not_derived_again():
    a, b = derive_trace(oi_bounce()), derive_trace(list(reversed(oi_bounce())))
    assert [d.span_id for d in a] == [d.span_id for d in b]
    assert len({d.span_id for d in a}) == len(a)
    stored = [
        span(d.span_id, d.parent_span_id, d.name, 0, 0,
             **{k.replace(".", "__"): str(v) for k, v in d.attributes})
        for d in a[:3]
    ]  # fmt: skip
    assert [d.span_id for d in new_transitions(oi_bounce() + stored)] == [d.span_id for d in a[3:]]


def test_nothing_is_derived_where_the_shim_or_an_adapter_recorded_the_handoff():
    adapter = span("00000000000000f1", "", "handoff.create", 8, 8, scope="x",
                   handoff__handoff_id="span_1", handoff__event="create")  # fmt: skip
    assert derive_trace([*oi_bounce(), adapter]) == []


def test_a_handoff_waits_for_its_source_agent_span_and_then_its_target():
    spans = oi_bounce()
    handoff_only = [s for s in spans if s.span_id in ("00000000000000b4",)]
    assert derive_trace(handoff_only) == []  # the run it belongs to is not known yet
    source_done = [s for s in spans if s.span_id.startswith("00000000000000b")]
    assert events(derive_trace(source_done)) == [("create", "planner", None)]


def test_the_run_ended_before_the_target_ran():
    spans = [s for s in oi_bounce() if s.span_id.startswith("00000000000000b")]
    out = derive_trace([*spans, oi_workflow(40)])
    assert events(out) == [
        ("create", "planner", None), ("accept", "coder", None), ("start", "coder", None),
        ("fail", "coder", "run_ended_before_target_finished"),
    ]  # fmt: skip


def test_a_failing_target_fails_the_handoff():
    spans = [s for s in oi_bounce() if s.span_id.startswith("00000000000000b")] + [
        oi_agent("00000000000000d1", "coder", 11, 20, status="Error",
                 message="Error in agent run: {'error': 'Error code: 500'}"),
        oi_llm("00000000000000d3", "00000000000000d1", 12, 18, status="Error",
               message="Error getting response: {'error': 'Error code: 500'}"),
    ]  # fmt: skip
    assert events(derive_trace(spans))[-1] == ("fail", "coder", "error_in_agent_run")


def test_multiple_handoffs_reject_the_ignored_ones():
    msg = "Multiple handoffs requested: {'requested_agents': ['coder', 'reviewer']}"
    spans = [
        oi_agent("00000000000000b1", "planner", 1, 10),
        _with(oi_handoff("00000000000000b4", "00000000000000b1", "planner", "coder", 8),
              status="Error", status_message=msg),
    ]  # fmt: skip
    out = derive_trace(spans)
    assert events(out) == [
        ("create", "planner", None), ("create", "planner", None),
        ("reject", "planner", "multiple_handoffs"),
    ]  # fmt: skip
    assert out[1].attr("handoff.to_agent") == "reviewer"
    assert out[1].attr("handoff.handoff_id") == f"{T}/00000000000000b4:1"


def _fields(s: SpanRecord) -> dict:
    return {f: getattr(s, f) for f in SpanRecord.__slots__}


def test_openllmetry_target_is_the_next_agent_run_and_never_guessed():
    def agent(sid, name, start, end, **kw):
        return span(sid, "00000000000000c1", f"{name}.agent", start, end, scope=TL,
                    traceloop__span__kind="agent", gen_ai__agent__name=name,
                    gen_ai__operation__name="invoke_agent", **kw)  # fmt: skip

    handoff = span("00000000000000b4", "00000000000000b1", "planner → unknown.handoff", 8, 9,
                   scope=TL, traceloop__span__kind="handoff", gen_ai__operation__name="handoff",
                   gen_ai__handoff__from_agent="planner")  # fmt: skip
    planner = agent("00000000000000b1", "planner", 1, 10)
    assert derive_trace([planner, handoff]) == []  # the target is not known (yet)
    workflow = span("00000000000000c1", "", "Agent Workflow", 0, 40, scope=TL,
                    traceloop__span__kind="workflow")  # fmt: skip
    unresolved = derive_trace([planner, handoff, workflow])
    assert events(unresolved) == [
        ("create", "planner", None), ("reject", "planner", "handoff_target_unresolved")
    ]  # fmt: skip
    assert unresolved[0].attr("handoff.to_agent") == "unknown"
    response = span("00000000000000d2", "00000000000000d1", "openai.response", 12, 18, scope=TL,
                    gen_ai__operation__name="chat")  # fmt: skip
    out = derive_trace([planner, handoff, agent("00000000000000d1", "coder", 11, 20), response])
    assert out[0].attr("handoff.to_agent") == "coder"
    assert out[0].attr("handoff.derived_by") == OPENLLMETRY
    assert [e for e, _, _ in events(out)] == ["create", "accept", "start", "prepare", "commit"]
    assert out[3].attr("handoff.evidence.count") == 1


def test_genai_execute_tool_transfer():
    def g(sid, parent, name, start, end, status="Unset", **kw):
        return span(sid, parent, name, start, end, scope="any", status=status, **kw)

    root = g("00000000000000a1", "", "workflow", 0, 50)
    src = g("00000000000000b1", "00000000000000a1", "invoke_agent triage", 1, 10,
            gen_ai__operation__name="invoke_agent", gen_ai__agent__name="triage")  # fmt: skip
    tool = g("00000000000000b2", "00000000000000b1", "execute_tool transfer_to_billing", 5, 6,
             gen_ai__operation__name="execute_tool", gen_ai__agent__handoff__source__name="triage",
             gen_ai__agent__handoff__target__name="billing")  # fmt: skip
    dst = g("00000000000000d1", "00000000000000a1", "invoke_agent billing", 11, 20,
            gen_ai__operation__name="invoke_agent", gen_ai__agent__name="billing")  # fmt: skip
    chat = g("00000000000000d2", "00000000000000d1", "chat m", 12, 19,
             gen_ai__operation__name="chat")  # fmt: skip
    assert events(derive_trace([src, tool])) == [("create", "triage", None)]
    out = derive_trace([root, src, tool, dst, chat])
    assert [e for e, _, _ in events(out)] == ["create", "accept", "start", "prepare", "commit"]
    assert out[0].attr("handoff.derived_by") == GENAI
    assert out[3].attr("handoff.evidence_refs") == ("genai:00000000000000d2",)
    failed = derive_trace([root, src, tool, _with(dst, status="Error", status_message="boom")])
    assert events(failed)[-1] == ("fail", "billing", "boom")
    ended = derive_trace([root, src, tool])
    assert events(ended)[-1] == ("fail", "billing", "run_ended_before_target_finished")


def _with(s: SpanRecord, **kw) -> SpanRecord:
    return SpanRecord(**{**_fields(s), **kw})


def test_sdk_error_texts():
    assert sdk_error_message("Error in agent run: {'error': 'x'}") == "Error in agent run"
    assert sdk_error_message("{'message': 'Error in agent run', 'data': {}}") == (
        "Error in agent run"
    )
    assert requested_agents("{'message': 'M', 'data': {'requested_agents': ['a', 'b']}}") == (
        "a", "b"
    )  # fmt: skip
    assert requested_agents("no list") == ()


def test_analytics_reads_the_attribute_derive_writes():
    import derive
    from analytics.origin import DERIVED_BY

    assert DERIVED_BY == derive.DERIVED_BY


LC = "openinference.instrumentation.langchain"


def test_langgraph_parent_command_is_a_handoff_not_a_failure():
    from derive import SpanEvent
    from derive.langgraph import LANGGRAPH

    pc = (SpanEvent("exception", 0, {"exception.type": "langgraph.errors.ParentCommand"}),)
    command = '{"graph": "__parent__", "update": {"active_agent": "bob"}, "goto": "bob"}'

    def lc(sid, parent, name, start, end, **kw):
        return span(sid, parent, name, start, end, scope=LC, **kw)

    root = lc("00000000000000a1", "", "LangGraph", 0, 50, openinference__span__kind="CHAIN")
    alice = _with(lc("00000000000000b1", "00000000000000a1", "alice", 1, 10,
                     openinference__span__kind="CHAIN"), events=pc)  # fmt: skip
    tools = _with(lc("00000000000000b2", "00000000000000b1", "tools", 5, 9,
                     openinference__span__kind="CHAIN"), events=pc, status="Error")  # fmt: skip
    tool = lc("00000000000000b3", "00000000000000b2", "transfer_to_bob", 6, 7,
              openinference__span__kind="TOOL", tool__name="transfer_to_bob",
              output__value=command)  # fmt: skip
    bob = lc("00000000000000d1", "00000000000000a1", "bob", 11, 20,
             openinference__span__kind="CHAIN")  # fmt: skip
    llm = lc("00000000000000d2", "00000000000000d1", "ChatOpenAI", 12, 19,
             openinference__span__kind="LLM")  # fmt: skip
    assert derive_trace([alice, tools, tool, bob, llm]) == []  # the graph's root is not stored
    out = derive_trace([root, alice, tools, tool, bob, llm])
    assert [e for e, _, _ in events(out)] == ["create", "accept", "start", "prepare", "commit"]
    assert (out[0].attr("handoff.from_agent"), out[0].attr("handoff.to_agent")) == ("alice", "bob")
    assert out[0].attr("handoff.derived_by") == LANGGRAPH
    failing = _with(bob, status="Error", status_message="RuntimeError('boom')\nTraceback",
                    events=(SpanEvent("exception", 0, {"exception.type": "RuntimeError"}),))  # fmt: skip
    assert events(derive_trace([root, alice, tools, tool, failing]))[-1] == (
        "fail", "bob", "runtimeerror"
    )  # fmt: skip


def test_derived_spans_pass_ingest_validation_as_legal_transitions():
    from derive import encode
    from ingest import decode_request

    derived = derive_trace(oi_bounce())
    batch = decode_request(encode(derived), "protobuf", tenant="acme")
    assert (batch.spans, batch.stored, batch.rejects, batch.flagged) == (10, 10, [], 0)
    assert len(batch.ledger) == 10  # every one a transition, in the ledger
    cols = batch.columns
    assert cols["SpanId"] == [d.span_id for d in derived]
    assert set(cols["TraceId"]) == {T}
