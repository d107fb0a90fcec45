"""bench/freshness.py's pure parts: the requests it posts, its pacing and its percentiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.tracer import INSTRUMENTATION_NAME

_PATH = Path(__file__).resolve().parents[2] / "bench" / "freshness.py"
_spec = importlib.util.spec_from_file_location("bench_freshness", _PATH)
assert _spec and _spec.loader
fresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fresh)


def _spans(body: bytes) -> list[dict[str, str]]:
    """Each span's attributes, plus its trace id (hex) as "trace" and its scope as "scope"."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return [
        {kv.key: str(getattr(kv.value, kv.value.WhichOneof("value"))) for kv in sp.attributes}
        | {"trace": sp.trace_id.hex(), "scope": ss.scope.name}
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for sp in ss.spans
    ]


def test_requests_look_like_the_shims_one_trace_per_handoff():
    """The shim's scope (derive/ skips it) and a new trace per handoff in every request: a
    trace id reused across requests would grow one trace without bound."""
    template = fresh.load_template(10, 1_800_000_000 * 10**9)
    a, b = _spans(fresh.stamp(template, 1)), _spans(fresh.stamp(template, 2))
    probes = _spans(fresh.probe_request(1, 10**18)) + _spans(fresh.probe_request(2, 10**18))
    assert {s["scope"] for s in a + probes} == {INSTRUMENTATION_NAME}
    for spans in (a, b):
        by_handoff = {(s["handoff.handoff_id"], s["trace"]) for s in spans}
        assert len(by_handoff) == len({s["trace"] for s in spans}) == 2
    assert not {s["trace"] for s in a} & {s["trace"] for s in b}
    assert len({s["trace"] for s in probes}) == 2
    assert not {s["trace"] for s in probes} & {s["trace"] for s in a + b}


def test_each_stamped_request_holds_new_handoffs_and_stays_valid():
    template = fresh.load_template(10, 1_800_000_000 * 10**9)
    a, b = _spans(fresh.stamp(template, 1)), _spans(fresh.stamp(template, 2))
    assert len(a) == len(b) == 10
    ids_a = {s["handoff.handoff_id"] for s in a}
    ids_b = {s["handoff.handoff_id"] for s in b}
    assert ids_a == {"h-0000000000000001-0", "h-0000000000000001-1"}
    assert not ids_a & ids_b
    assert [s["handoff.event"] for s in a[:5]] == ["create", "accept", "start", "commit", "verify"]
    assert fresh.MARK not in fresh.stamp(template, 3)


def test_a_probe_is_an_implied_accept_with_its_own_target():
    spans = _spans(fresh.probe_request(7, 10**18))
    assert [
        (s["handoff.event"], s["handoff.from_state"], s["handoff.to_state"]) for s in spans
    ] == [
        ("create", "", "created"),
        ("start", "accepted", "running"),
    ]
    assert spans[0]["handoff.to_agent"] == spans[0]["handoff.handoff_id"] == fresh.probe_id(7)


def test_percentile_freshness_and_schedule():
    assert fresh.percentile([5, 1, 3, 2, 4], 50) == 3
    assert fresh.percentile(list(range(1, 101)), 99) == 99
    assert fresh.percentile([7], 99) == 7
    with pytest.raises(ValueError, match="no values"):
        fresh.percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        fresh.percentile([1], 101)
    ms, unseen = fresh.freshness_ms({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.25, 2: 3.5})
    assert ms == [250.0, 500.0] and unseen == 1
    assert fresh.schedule(10.0, 0.5, 0.1, 3) == [10.1, 10.6, 11.1]
    with pytest.raises(ValueError, match="interval"):
        fresh.schedule(0.0, 0.0, 0.0, 1)


def test_bracket_of_each_probe_between_the_polls_around_it():
    # probe 0 acknowledged at 1.0 s: missed by polls starting 0.9 (before its 200) and 1.2,
    # counted by the poll starting 1.5; probe 1 (2.0 s) counted by the first poll after it;
    # probe 2 never counted
    polls = [
        (0.9, 1.0, frozenset()),
        (1.2, 1.4, frozenset()),
        (1.5, 1.8, frozenset({0})),
        (2.1, 2.3, frozenset({0, 1})),
    ]
    before, first = fresh.bracket({0: 1.0, 1: 2.0, 2: 3.0}, polls)
    assert before == pytest.approx([200.0, 0.0])
    assert first == pytest.approx([500.0, 100.0])
    # a poll that started before the 200 and still counted it: countable at the 200
    assert fresh.bracket({0: 1.0}, [(0.95, 1.1, frozenset({0}))]) == ([0.0], [0.0])


def test_prom_values_reads_the_settle_counters():
    text = (
        "# HELP handoffs_settle_settles_total settles run\n"
        "# TYPE handoffs_settle_settles_total counter\n"
        "handoffs_settle_settles_total 3.0\n"
        "handoffs_settle_last_seconds 4.25\n"
        'handoffs_settle_other{tenant="a"} 1.0\n'
        "handoffs_derive_passes_total 9.0\n"
    )
    assert fresh.prom_values(text, "handoffs_settle_") == {
        "handoffs_settle_settles_total": 3.0,
        "handoffs_settle_last_seconds": 4.25,
    }
