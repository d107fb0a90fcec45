"""Blind spots, pure parts: which spans name an agent, and when a trace is a blind spot
(two or more agents, nothing derived, no handoff transition stored)."""

from __future__ import annotations

import pytest

from derive import SpanRecord, derive_trace
from derive._blind import agent_of, agent_scope, agents, is_blind, judge, verdicts

T = "a" * 32
SCOPE = "acme.unknown.framework"


def span(
    sid: str,
    name: str = "step",
    *,
    parent: str = "",
    attrs: dict[str, str] | None = None,
    scope: str = SCOPE,
    tenant: str = "default",
    trace: str = T,
    start: int = 1_000,
) -> SpanRecord:
    return SpanRecord(
        trace_id=trace,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        start_ns=start,
        end_ns=start + 500,
        scope=scope,
        attributes=attrs or {},
        tenant=tenant,
    )


@pytest.mark.parametrize(
    ("name", "attrs", "want"),
    [
        ("agent run", {"gen_ai.agent.name": "triage"}, "triage"),
        ("Agent workflow", {"agent.name": "billing"}, "billing"),  # OpenInference
        ("node", {"graph.node.id": "planner"}, "planner"),  # OpenInference agent graph
        ("invoke_agent refunds", {}, "refunds"),  # GenAI span name, Strands
        ("executor.process writer", {}, "writer"),  # Microsoft Agent Framework
        ("executor.process writer", {"executor.id": "writer_1"}, "writer_1"),
        ("invoke_agent x", {"gen_ai.agent.name": "named"}, "named"),  # the attribute first
        ("invoke_agent ", {}, None),  # no name after the prefix
        ("chat gpt-x", {"gen_ai.operation.name": "chat"}, None),
        ("step", {"gen_ai.agent.name": "  "}, None),  # blank is no name
    ],
)
def test_agent_of_recognises_the_documented_names(name, attrs, want):
    assert agent_of(span("1", name, attrs=attrs)) == want


def test_agents_are_distinct_and_sorted_and_scope_is_that_of_the_agent_spans():
    spans = [
        span("1", "root", scope="app"),
        span("2", attrs={"gen_ai.agent.name": "writer"}),
        span("3", attrs={"gen_ai.agent.name": "critic"}),
        span("4", attrs={"gen_ai.agent.name": "writer"}),
        span("5", "invoke_agent critic", scope="other.scope"),
    ]
    assert agents(spans) == ("critic", "writer")
    assert agent_scope(spans) == SCOPE  # three agent spans of it, one of other.scope
    assert agent_scope([span("1", "root")]) == ""


@pytest.mark.parametrize(
    ("count", "derived", "transitions", "want"),
    [
        (2, False, False, True),
        (5, False, False, True),
        (1, False, False, False),  # one agent: no handoff to miss
        (0, False, False, False),
        (2, True, False, False),  # a rule derived a handoff
        (2, False, True, False),  # the shim, an adapter or derivation recorded one
    ],
)
def test_the_decision(count, derived, transitions, want):
    assert is_blind(count, derived, transitions) is want


def test_a_multi_agent_trace_of_an_unknown_framework_is_blind():
    spans = [
        span("r", "acme.run", start=1_000),
        span("1", "acme.step", parent="r", attrs={"gen_ai.agent.name": "planner"}, start=2_000),
        span("2", "acme.step", parent="r", attrs={"gen_ai.agent.name": "coder"}, start=3_000),
    ]
    v = judge(spans, derived=bool(derive_trace(spans)))
    assert v is not None and v.blind
    assert (v.tenant, v.trace_id, v.scope, v.agents) == ("default", T, SCOPE, ("coder", "planner"))
    assert (v.first_ns, v.last_ns) == (1_000, 3_500)


def test_a_single_agent_trace_has_no_verdict():
    spans = [span("1", attrs={"gen_ai.agent.name": "solo"}), span("2", "invoke_agent solo")]
    assert judge(spans, derived=False) is None


def test_a_trace_holding_handoff_transitions_is_not_blind():
    shim = {"handoff.handoff_id": "h1", "gen_ai.agent.name": "planner"}
    spans = [
        span("1", "handoff.create", attrs=shim, scope="handoffs"),
        span("2", attrs={"gen_ai.agent.name": "coder"}),
    ]
    v = judge(spans, derived=False)
    assert v is not None and not v.blind


def test_a_trace_the_genai_rule_derives_is_not_blind():
    op = "gen_ai.operation.name"
    spans = [
        span("r", "conversation", scope="app", start=0),
        span("a", "invoke_agent triage", parent="r", start=100,
             attrs={op: "invoke_agent", "gen_ai.agent.name": "triage"}),
        span("t", "execute_tool transfer_to_billing", parent="a", start=200,
             attrs={op: "execute_tool", "gen_ai.agent.handoff.source.name": "triage",
                    "gen_ai.agent.handoff.target.name": "billing"}),
        span("b", "invoke_agent billing", parent="r", start=800,
             attrs={op: "invoke_agent", "gen_ai.agent.name": "billing"}),
    ]  # fmt: skip
    derived = derive_trace(spans)
    assert derived
    (v,) = verdicts(spans, derived)
    assert not v.blind and v.agents == ("billing", "triage")


def test_verdicts_judge_each_tenant_and_trace_apart():
    two = [{"gen_ai.agent.name": "a"}, {"gen_ai.agent.name": "b"}]
    spans = [
        span("1", attrs=two[0], tenant="acme"),
        span("2", attrs=two[1], tenant="acme"),
        span("3", attrs=two[0], tenant="globex"),  # one agent of globex in the same trace id
        span("4", attrs=two[0], trace="b" * 32),
        span("5", attrs=two[1], trace="b" * 32),
    ]
    got = {(v.tenant, v.trace_id): v.blind for v in verdicts(spans, [])}
    assert got == {("acme", T): True, ("default", "b" * 32): True}


def test_judge_refuses_spans_of_several_traces():
    with pytest.raises(ValueError, match="exactly one"):
        judge([span("1"), span("2", trace="c" * 32)], derived=False)
    with pytest.raises(ValueError, match="exactly one"):
        judge([], derived=False)
