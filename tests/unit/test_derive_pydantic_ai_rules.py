"""The Pydantic AI rule on plain span records, shaped as Pydantic AI's instrumentation records
them (scope `pydantic-ai`, a delegation as an agent run nested in a tool span, status Unset on
success), and the GenAI rule's clock order on the same nesting."""

from __future__ import annotations

from dataclasses import replace

from derive import SpanEvent, SpanRecord, derive_trace, new_transitions
from derive._rules import Hold, derivation
from derive.genai import GENAI
from derive.pydantic_ai import PYDANTIC_AI, PYDANTIC_AI_SCOPE, nested_runs

T = "4bf92f3577b34da6a3ce929d0e0e4736"
MS = 1_000_000
ROOT = "00000000000000a0"


def span(sid, parent, name, start, end, status="Unset", message="", scope=PYDANTIC_AI_SCOPE,
         events=(), **attrs):  # fmt: skip
    return SpanRecord(
        trace_id=T, span_id=sid, parent_span_id=parent, name=name, start_ns=start * MS,
        end_ns=end * MS, status=status, status_message=message, scope=scope,
        service_name="app", attributes={k.replace("__", "."): v for k, v in attrs.items()},
        events=events,
    )  # fmt: skip


def run(sid, parent, agent, start, end, **kw):
    return span(sid, parent, f"invoke_agent {agent}", start, end,
                gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent, **kw)  # fmt: skip


def chat(sid, parent, agent, start, end, **kw):
    return span(sid, parent, f"chat {agent}", start, end, gen_ai__operation__name="chat",
                gen_ai__agent__name=agent, **kw)  # fmt: skip


def tool(sid, parent, agent, name, start, end, **kw):
    return span(sid, parent, f"execute_tool {name}", start, end,
                gen_ai__operation__name="execute_tool", gen_ai__tool__name=name,
                gen_ai__agent__name=agent, gen_ai__tool__call__arguments='{"question":"q"}',
                **kw)  # fmt: skip


def bounce():
    """triage asks refund (a tool running refund), refund asks triage back, as nested runs."""
    return [
        span(ROOT, "", "bounce", 0, 100, scope="support-app"),
        run("00000000000000b1", ROOT, "triage", 1, 99),
        chat("00000000000000b2", "00000000000000b1", "triage", 2, 10),
        tool("00000000000000b3", "00000000000000b1", "triage", "ask_refund", 11, 80),
        run("00000000000000c1", "00000000000000b3", "refund", 12, 79),
        chat("00000000000000c2", "00000000000000c1", "refund", 13, 20),
        tool("00000000000000c3", "00000000000000c1", "refund", "ask_triage", 21, 60),
        run("00000000000000d1", "00000000000000c3", "triage", 22, 59),
        chat("00000000000000d2", "00000000000000d1", "triage", 23, 58),
        chat("00000000000000c4", "00000000000000c1", "refund", 61, 78),
        chat("00000000000000b4", "00000000000000b1", "triage", 81, 98),
    ]


def events(derived):
    return [(d.attr("handoff.event"), d.attr("handoff.actor"), d.attr("handoff.error_code"))
            for d in derived]  # fmt: skip


def test_nested_runs_are_delegations_back_to_the_caller():
    out = derive_trace(bounce())
    assert events(out) == [
        ("create", "triage", None), ("accept", "refund", None), ("start", "refund", None),
        ("prepare", "refund", None), ("commit", "refund", None),
        ("create", "refund", None), ("accept", "triage", None), ("start", "triage", None),
        ("prepare", "triage", None), ("commit", "triage", None),
    ]  # fmt: skip
    first, second = out[0], out[5]
    assert {d.attr("handoff.derived_by") for d in out} == {PYDANTIC_AI}
    assert (first.attr("handoff.mode"), first.attr("handoff.topology")) == (
        "delegate", "agent_as_tool"
    )  # fmt: skip
    assert first.attr("handoff.handoff_id") == f"{T}/00000000000000b3"
    assert second.attr("handoff.causation_id") == first.attr("handoff.handoff_id")
    assert out[4].attr("handoff.execution.id") == "00000000000000c1"
    # the refund run's evidence: its model calls, the nested run's and the tool call
    refs = out[3].attr("handoff.evidence_refs")
    assert isinstance(refs, tuple) and "pydantic_ai:00000000000000c2" in refs


def test_transitions_are_in_clock_order_inside_the_tool_span():
    out = derive_trace(bounce())
    # create at the tool's start, accept + start at the nested run's start, results at its end
    assert [d.time_ns // MS for d in out[:5]] == [11, 12, 12, 79, 79]
    assert [d.time_ns // MS for d in out[5:]] == [21, 22, 22, 59, 59]
    for h in (out[:5], out[5:]):
        assert [d.time_ns for d in h] == sorted(d.time_ns for d in h)
    # each transition is parented by the span it was read from, the tool span kept whole
    assert out[0].parent_span_id == "00000000000000b3" == out[1].parent_span_id


def test_a_failing_model_call_fails_the_delegation_with_the_exception_type():
    msg = "ModelServerError: status_code: 500, model_name: billing, body: {...}"
    boom = SpanEvent("exception", 15 * MS,
                     {"exception.type": "pydantic_ai.exceptions.ModelServerError"})  # fmt: skip
    spans = [
        span(ROOT, "", "failing", 0, 100, scope="support-app"),
        run("00000000000000b1", ROOT, "triage", 1, 99, status="Error", message=msg),
        tool("00000000000000b3", "00000000000000b1", "triage", "ask_billing", 11, 80,
             status="Error"),
        run("00000000000000c1", "00000000000000b3", "billing", 12, 79, status="Error",
            message=msg, events=(boom,)),
        chat("00000000000000c2", "00000000000000c1", "billing", 13, 78, status="Error",
             message=msg),
    ]  # fmt: skip
    out = derive_trace(spans)
    assert events(out) == [("create", "triage", None), ("accept", "billing", None),
                           ("start", "billing", None), ("fail", "billing", "model_server_error")]  # fmt: skip
    # the run's status Unset but its model call in Error: still a failed execution
    quiet = [*spans[:3], replace(spans[3], status="Unset", status_message=""), spans[4]]
    assert events(derive_trace(quiet))[-1] == ("fail", "billing", "model_server_error")
    # no status description: the exception event's type
    bare = [*spans[:3], replace(spans[3], status_message=""), replace(spans[4], status="Unset")]
    assert events(derive_trace(bare))[-1] == ("fail", "billing", "model_server_error")


def test_plain_tools_and_other_scopes_derive_nothing():
    plain = [s for s in bounce() if s.span_id[-2] not in "cd"]  # ask_refund ran no agent
    plain = [s for s in plain if s.span_id != "00000000000000b3"] + [
        tool("00000000000000b3", "00000000000000b1", "triage", "lookup", 11, 80)
    ]
    assert derive_trace(plain) == []
    assert derive_trace([replace(s, scope="other") for s in bounce()]) == []
    # before the nested run is stored nothing is derived (no guess from the tool's name)
    assert derive_trace(bounce()[:4]) == []


def test_a_run_nested_under_another_tool_belongs_to_that_tool():
    trace = bounce()
    from derive._trace import TraceIndex

    idx = TraceIndex(trace)
    outer = idx.get("00000000000000b3")
    inner = idx.get("00000000000000c3")
    assert outer is not None and inner is not None
    assert [s.span_id for s in nested_runs(idx, outer)] == ["00000000000000c1"]
    assert [s.span_id for s in nested_runs(idx, inner)] == ["00000000000000d1"]


def test_resent_spans_derive_nothing_twice():
    spans = bounce()
    first = new_transitions(spans)
    stored = [
        SpanRecord(T, d.span_id, d.parent_span_id, d.name, d.time_ns, d.time_ns,
                   attributes={k: str(v) for k, v in d.attributes})
        for d in first
    ]  # fmt: skip
    assert len(first) == 10 and new_transitions(spans + spans + stored) == []


def test_genai_rule_orders_a_nested_target_run_as_a_delegation():
    """An app naming the handoff itself (proposed gen_ai.agent.handoff.* attributes) on spans
    of another scope: the GenAI rule reads them, accept + start at the nested run's start."""
    named = {"gen_ai__agent__handoff__source__name": "triage",
             "gen_ai__agent__handoff__target__name": "refund"}  # fmt: skip
    spans = [replace(s, scope="custom") for s in bounce()[:6]]
    spans[3] = replace(tool("00000000000000b3", "00000000000000b1", "triage", "ask_refund", 11,
                            80, scope="custom", **named))  # fmt: skip
    out = derive_trace(spans)
    assert {d.attr("handoff.derived_by") for d in out} == {GENAI}
    assert events(out) == [("create", "triage", None), ("accept", "refund", None),
                           ("start", "refund", None), ("prepare", "refund", None),
                           ("commit", "refund", None)]  # fmt: skip
    assert [d.time_ns // MS for d in out] == [11, 12, 12, 79, 79]
    assert (out[0].attr("handoff.mode"), out[0].attr("handoff.topology")) == (
        "delegate", "agent_as_tool"
    )  # fmt: skip
    # the same attributes on Pydantic AI's own spans: its rule reads them, once
    own = [*bounce()[:3], tool("00000000000000b3", "00000000000000b1", "triage", "ask_refund",
                               11, 80, **named), *bounce()[4:6]]  # fmt: skip
    mine = derive_trace(own)
    assert {d.attr("handoff.derived_by") for d in mine} == {PYDANTIC_AI}
    assert [d.time_ns // MS for d in mine] == [11, 12, 12, 79, 79]


# ------------------------------------------------------------ spans in two export batches

NOW = 1_800_000_000


def ended_by(spans, ms, stored_s=NOW):
    """The spans a batching exporter has sent by `ms`: those ended by then (a span is sent
    when it ends), stored at `stored_s`."""
    return [replace(s, stored_s=stored_s) for s in spans if s.end_ns <= ms * MS]


def test_a_delegation_whose_enclosing_run_is_not_stored_waits_for_it():
    first = ended_by(bounce(), 60)  # refund's own delegation back, not yet refund's run
    early = derivation(first, hold=Hold(NOW + 2, 30))
    assert early.transitions == () and early.held == 1
    # without the hold it would be derived now, with no cause, and stored so for good
    bare = derive_trace(first)
    assert bare and bare[0].attr("handoff.causation_id") is None

    rest = [s for s in ended_by(bounce(), 100, NOW + 5) if s.end_ns > 60 * MS]
    later = derivation([*first, *rest], hold=Hold(NOW + 6, 30))
    assert later.held == 0
    creates = [d for d in later.transitions if d.attr("handoff.event") == "create"]
    assert [c.attr("handoff.causation_id") for c in creates] == [None, f"{T}/00000000000000b3"]
    assert later.transitions == tuple(derive_trace(bounce()))


def test_a_held_delegation_is_derived_with_what_is_stored_once_the_hold_ends():
    first = ended_by(bounce(), 60)
    assert derivation(first, hold=Hold(NOW + 29, 30)).held == 1
    late = derivation(first, hold=Hold(NOW + 30, 30))
    assert late.held == 0 and late.transitions == tuple(derive_trace(first))
    # a span whose stored time is not known is not held
    assert derivation(ended_by(bounce(), 60, 0), hold=Hold(NOW, 30)).held == 0
