"""The pure parts of derivation per tenant: spans grouped by (tenant, trace id), and the
fair schedule of a pass (round robin over tenants, a span budget per turn and per pass,
the rest waiting for the next pass, nothing lost)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from derive import SpanRecord, derive_trace, derive_traces
from derive._schedule import Backlog, TraceKey, Work, enqueue, plan_pass

T = "4bf92f3577b34da6a3ce929d0e0e4736"
MS = 1_000_000


def g(sid, parent, name, start, end, tenant, status="Unset", message="", **attrs):
    return SpanRecord(
        trace_id=T, span_id=sid, parent_span_id=parent, name=name, start_ns=start * MS,
        end_ns=end * MS, status=status, status_message=message, scope="app",
        service_name=f"{tenant}-app", tenant=tenant,
        attributes={k.replace("__", "."): v for k, v in attrs.items()},
    )  # fmt: skip


def invoke(sid, parent, agent, start, end, tenant, **kw):
    return g(sid, parent, f"invoke_agent {agent}", start, end, tenant,
             gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent, **kw)  # fmt: skip


def globex() -> list[SpanRecord]:
    """triage -> billing, billing runs fine (20..30 ms)."""
    return [
        g("00000000000000a1", "", "conversation", 0, 100, "globex"),
        invoke("00000000000000b1", "00000000000000a1", "triage", 1, 10, "globex"),
        g("00000000000000b2", "00000000000000b1", "execute_tool transfer_to_billing", 5, 6,
          "globex", gen_ai__operation__name="execute_tool",
          gen_ai__agent__handoff__source__name="triage",
          gen_ai__agent__handoff__target__name="billing"),
        invoke("00000000000000d1", "00000000000000a1", "billing", 20, 30, "globex"),
    ]  # fmt: skip


def events(derived):
    return [(d.tenant, d.attr("handoff.event"), d.attr("handoff.error_code")) for d in derived]


COMMITTED = [("globex", e, None) for e in ("create", "accept", "start", "prepare", "commit")]


def test_a_foreign_failed_run_in_the_trace_does_not_fail_the_handoff():
    # acme's failed `billing` run starts between globex's transfer and globex's billing run
    foreign = invoke("00000000000000e1", "00000000000000b2", "billing", 12, 15, "acme",
                     status="Error", message="acme outage")  # fmt: skip
    out = derive_traces([*globex(), foreign])
    assert events(out) == COMMITTED
    assert {d.attr("handoff.execution.id") for d in out} == {None, "00000000000000d1"}
    assert derive_traces([*globex(), foreign]) == derive_traces(globex())


def test_a_foreign_shim_transition_does_not_suppress_derivation():
    shim = g("00000000000000f1", "00000000000000b2", "handoff.create", 80, 80, "acme",
             handoff__handoff_id="acme-1", handoff__event="create")  # fmt: skip
    assert events(derive_traces([*globex(), shim])) == COMMITTED
    # the tenant's own shim transition still does
    assert derive_traces([*globex(), replace(shim, tenant="globex")]) == []


def test_a_foreign_derived_span_does_not_count_as_stored():
    stored = derive_traces(globex())
    as_acme = [
        g(d.span_id, d.parent_span_id, d.name, 0, 0, "acme", **{
            k.replace(".", "__"): str(v) for k, v in d.attributes})
        for d in stored
    ]  # fmt: skip
    assert derive_traces([*globex(), *as_acme]) == stored


def test_derive_trace_refuses_spans_of_two_tenants():
    with pytest.raises(ValueError, match="tenant"):
        derive_trace([*globex(), replace(globex()[0], tenant="acme", span_id="00000000000000ff")])


def w(tenant: str, trace: str, spans: int) -> Work:
    return Work(TraceKey(tenant, trace), spans)


def taken(plan) -> list[tuple[str, list[str]]]:
    return [(t.tenant, [x.key.trace_id for x in t.work]) for t in plan.turns]


def test_turns_go_round_robin_within_the_turn_budget():
    backlog = enqueue(Backlog(), [w("acme", "a1", 6000), w("acme", "a2", 3000),
                                  w("acme", "a3", 3000), w("globex", "g1", 10),
                                  w("initech", "i1", 10), w("globex", "g2", 10)])  # fmt: skip
    plan = plan_pass(backlog, turn_spans=10_000, pass_spans=100_000)
    assert taken(plan) == [
        ("acme", ["a1", "a2"]), ("globex", ["g1", "g2"]), ("initech", ["i1"]), ("acme", ["a3"])
    ]  # fmt: skip
    assert plan.rest.queues == () and plan.spans == 12_030


def test_a_trace_larger_than_the_turn_budget_is_a_turn_of_its_own():
    backlog = enqueue(Backlog(), [w("acme", "huge", 50_000), w("acme", "a2", 5),
                                  w("globex", "g1", 5)])  # fmt: skip
    plan = plan_pass(backlog, turn_spans=1000, pass_spans=100_000)
    assert taken(plan) == [("acme", ["huge"]), ("globex", ["g1"]), ("acme", ["a2"])]


def test_the_pass_budget_leaves_the_rest_waiting_and_the_next_pass_goes_on_from_there():
    huge = [w("acme", f"a{i}", 1000) for i in range(10)]
    backlog = enqueue(Backlog(), [*huge, w("globex", "g1", 10), w("initech", "i1", 10)])
    first = plan_pass(backlog, turn_spans=2000, pass_spans=2500)
    # every other tenant had its turn before acme's second
    assert taken(first) == [("acme", ["a0", "a1"]), ("globex", ["g1"]), ("initech", ["i1"]),
                            ("acme", ["a2", "a3"])]  # fmt: skip
    assert first.rest.last == "acme"
    assert [x.key.trace_id for _, q in first.rest.queues for x in q] == [
        f"a{i}" for i in range(4, 10)
    ]
    # new work arrives; the next pass starts after acme, so globex goes first
    second = plan_pass(enqueue(first.rest, [w("globex", "g2", 10), w("acme", "a5", 900)]),
                       turn_spans=2000, pass_spans=2500)  # fmt: skip
    assert taken(second)[:2] == [("globex", ["g2"]), ("acme", ["a4", "a5"])]


def test_nothing_is_lost_and_no_trace_is_read_twice_in_a_pass():
    """Passes until nothing waits: every trace touched is read exactly once per touch."""
    backlog, read = Backlog(), []
    touches = [[w(t, f"{t}{i}", (i * 37) % 900 + 1) for t in ("a", "b", "c") for i in range(k)]
               for k in (40, 3, 0, 25)]  # fmt: skip
    for batch in [*touches, *[[]] * 30]:  # then passes with nothing new
        plan = plan_pass(enqueue(backlog, batch), turn_spans=1500, pass_spans=4000)
        keys = [x.key for t in plan.turns for x in t.work]
        assert len(keys) == len(set(keys))
        assert plan.spans < 4000 + 1500
        read += keys
        backlog = plan.rest
    assert backlog.traces == 0
    assert set(read) == {x.key for batch in touches for x in batch}


def test_a_trace_touched_again_while_waiting_keeps_its_place_with_the_new_count():
    backlog = enqueue(Backlog(), [w("a", "t1", 10), w("a", "t2", 10)])
    backlog = enqueue(backlog, [w("a", "t3", 1), w("a", "t1", 99)])
    ((_, queue),) = backlog.queues
    assert [(x.key.trace_id, x.spans) for x in queue] == [("t1", 99), ("t2", 10), ("t3", 1)]
    # the same trace id of another tenant is other work
    backlog = enqueue(backlog, [w("b", "t1", 5)])
    assert backlog.traces == 4 and backlog.spans == 115


def test_budgets_under_one_span_are_refused():
    with pytest.raises(ValueError):
        plan_pass(Backlog(), turn_spans=0, pass_spans=10)
    with pytest.raises(ValueError):
        plan_pass(Backlog(), turn_spans=10, pass_spans=0)
