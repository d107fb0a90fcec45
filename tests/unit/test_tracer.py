"""The tracer shim against the real OTel SDK: spans, trace propagation, types, errors, filter."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from collector import (
    Envelope,
    EnvelopeError,
    HandoffTracer,
    IllegalTransition,
    InMemoryRecorder,
    InputFilter,
    semconv,
)
from collector.contract import NON_TERMINAL, TERMINAL, TRANSITIONS, Event, State, next_state

PY_TYPES = {"string": str, "int": int, "bool": bool}


def envelope(**kw) -> Envelope:
    base = dict(
        task_id="t1",
        handoff_id="h1",
        from_agent="planner",
        to_agent="coder",
        mode="delegate",
        capabilities=("code.write",),
        deadline_ms=60_000,
        idempotency_key="k1",
        topology="agent_as_tool",
        objective="fix bug 12",
    )
    return Envelope(**{**base, **kw})


@pytest.fixture
def sender():
    rec = InMemoryRecorder()
    yield rec, HandoffTracer("planner", tracer_provider=rec.provider)
    rec.shutdown()


@pytest.fixture
def receiver():
    rec = InMemoryRecorder()
    yield rec, HandoffTracer("coder", tracer_provider=rec.provider)
    rec.shutdown()


def assert_wire_types(attrs) -> None:
    for spec in semconv.WIRE_ATTRIBUTES:
        if spec.name not in attrs:
            continue
        value = attrs[spec.name]
        if spec.type == "string[]":
            assert isinstance(value, tuple) and all(type(v) is str for v in value), spec.name
        elif spec.type == "int[]":
            assert isinstance(value, tuple) and all(type(v) is int for v in value), spec.name
        else:
            assert type(value) is PY_TYPES[spec.type], (spec.name, value)


def test_two_providers_receiver_joins_sender_trace_with_typed_attributes(sender, receiver):
    s_rec, s_tracer = sender
    r_rec, r_tracer = receiver
    h = s_tracer.create(envelope(evidence_refs=["spec:1"], max_tool_calls=5, fence_token=2))
    assert h.state == "created"
    h2 = r_tracer.receive(h.to_wire())
    assert (h2.handoff_id, h2.task_id, h2.trace_id, h2.state) == ("h1", "t1", h.trace_id, "created")
    h2.accept()
    h2.start()
    h2.prepare(evidence_count=2, evidence_valid=True, evidence_refs=["doc:1", "test:2"])
    assert (
        h2.commit(receipt_status="ok", receipt_hash="sha256:00", result_version="v1") == "committed"
    )

    (create,) = s_rec.spans()
    r_spans = r_rec.spans()
    assert [s.name for s in r_spans] == [
        "handoff.accept",
        "handoff.start",
        "handoff.prepare",
        "handoff.commit",
    ]
    for span in r_spans:
        assert span.context.trace_id == create.context.trace_id  # the sender's trace
        assert span.parent.span_id == create.context.span_id
    assert f"{create.context.trace_id:032x}" == h.trace_id

    rows = s_rec.transitions() + r_rec.transitions()
    for row in rows:
        assert_wire_types(row)
        for name in semconv.REQUIRED_ON_EVERY:
            assert name in row, name
    c = rows[0]
    for name in semconv.REQUIRED_ON_CREATE:
        assert name in c, name
    assert c[semconv.CAPABILITIES] == ("code.write",)
    assert c[semconv.EVIDENCE_REFS] == ("spec:1",)
    assert c[semconv.DEADLINE_MS] == 60_000
    assert (c[semconv.FROM_STATE], c[semconv.TO_STATE], c[semconv.EVENT]) == (
        "",
        "created",
        "create",
    )
    assert [r[semconv.ACTOR] for r in rows] == ["planner", "coder", "coder", "coder", "coder"]
    assert [r[semconv.GEN_AI_AGENT_NAME] for r in rows] == [r[semconv.ACTOR] for r in rows]
    assert [r[semconv.GEN_AI_OPERATION_NAME] for r in rows] == [
        "handoff.create",
        "handoff.accept",
        "handoff.start",
        "handoff.prepare",
        "handoff.commit",
    ]
    prep, commit = rows[3], rows[4]
    assert (prep[semconv.EVIDENCE_COUNT], prep[semconv.EVIDENCE_VALID]) == (2, True)
    assert prep[semconv.EVIDENCE_REFS] == ("doc:1", "test:2")
    assert (commit[semconv.FROM_STATE], commit[semconv.TO_STATE]) == ("prepared", "committed")
    assert commit[semconv.RECEIPT_STATUS] == "ok"
    assert semconv.VALID not in commit  # only flagged transitions carry handoff.valid


def test_receiver_inside_its_own_request_span_stays_in_sender_trace(sender, receiver):
    _, s_tracer = sender
    r_rec, r_tracer = receiver
    h = s_tracer.create(envelope())
    other = r_rec.provider.get_tracer("server")
    with other.start_as_current_span("POST /tasks") as request:
        h2 = r_tracer.receive(h.to_wire())
        h2.accept()
    accept = next(s for s in r_rec.spans() if s.name == "handoff.accept")
    assert f"{accept.context.trace_id:032x}" == h.trace_id
    assert accept.context.trace_id != request.get_span_context().trace_id
    assert [link.context.span_id for link in accept.links] == [request.get_span_context().span_id]


def test_current_span_in_the_handoff_trace_becomes_the_parent(sender):
    rec, tracer = sender
    app = rec.provider.get_tracer("app")
    with app.start_as_current_span("plan") as plan:
        h = tracer.create(envelope())
        with app.start_as_current_span("wait") as wait:
            h.timeout(error_code="deadline")
    create, timeout = (s for s in rec.spans() if s.name.startswith("handoff."))
    assert create.parent.span_id == plan.get_span_context().span_id
    assert timeout.parent.span_id == wait.get_span_context().span_id
    assert timeout.attributes[semconv.ERROR_CODE] == "deadline"
    assert h.state == "unknown"


def test_outside_any_span_transitions_hang_under_create(sender):
    rec, tracer = sender
    h = tracer.create(envelope())
    h.cancel()
    create, cancel = rec.spans()
    assert create.parent is None
    assert cancel.parent.span_id == create.context.span_id
    assert not cancel.links


def test_strict_illegal_transition_raises_without_span(sender):
    rec, tracer = sender
    h = tracer.create(envelope())
    with pytest.raises(IllegalTransition) as ei:
        h.commit()
    assert str(ei.value) == (
        "event 'commit' is not allowed from state 'created'; allowed: accept, cancel, escalate, expire, reject, timeout"
    )
    assert h.state == "created"
    assert len(rec.spans()) == 1
    h.reject(error_code="busy")
    with pytest.raises(IllegalTransition, match=r"allowed: none \(terminal state\)"):
        h.accept()
    assert h.state == "rejected"


def test_lenient_illegal_transition_is_emitted_flagged(sender):
    rec, _ = sender
    tracer = HandoffTracer("planner", tracer_provider=rec.provider, strict=False)
    h = tracer.create(envelope())
    assert h.commit(receipt_status="ok") == "created"
    flagged = rec.transitions()[-1]
    assert flagged[semconv.VALID] is False
    assert flagged[semconv.INVALID_REASON].startswith(
        "event 'commit' is not allowed from state 'created'"
    )
    assert (flagged[semconv.FROM_STATE], flagged[semconv.TO_STATE]) == ("created", "committed")
    assert h.accept() == "accepted"  # state was unchanged, the machine goes on


@pytest.mark.parametrize("strict", [True, False])
def test_unknown_event_and_create_refused_in_both_modes(sender, strict):
    rec, _ = sender
    h = HandoffTracer("p", tracer_provider=rec.provider, strict=strict).create(envelope())
    with pytest.raises(IllegalTransition, match="unknown event 'explode'"):
        h.transition("explode")
    with pytest.raises(IllegalTransition, match="create is not an event of an existing handoff"):
        h.transition("create")
    assert len(rec.spans()) == 1


def test_redeliver_emits_a_duplicate_span(sender):
    rec, tracer = sender
    h = tracer.create(envelope())
    h.accept(at=1_000)
    h.redeliver(at=2_000)
    a, b = rec.spans()[1:]
    assert dict(a.attributes) == dict(b.attributes)
    assert a.context.span_id != b.context.span_id
    assert (a.start_time, b.start_time) == (1_000, 2_000)
    assert h.state == "accepted"


def test_redeliver_before_any_transition_is_refused(sender, receiver):
    _, s_tracer = sender
    _, r_tracer = receiver
    h2 = r_tracer.receive(s_tracer.create(envelope()).to_wire())
    with pytest.raises(IllegalTransition, match="nothing to redeliver: no transition emitted yet"):
        h2.redeliver()


def test_at_and_clock(sender):
    rec, _ = sender
    tracer = HandoffTracer("p", tracer_provider=rec.provider, clock=lambda: 5_000_000_000)
    h = tracer.create(envelope())
    t = datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=UTC)
    h.accept(at=t)
    h.start(at=t + timedelta(hours=1))
    create, accept, start = rec.spans()
    assert create.start_time == 5_000_000_000 == create.end_time
    assert accept.start_time == 1_796_029_200_123_456_000
    assert start.start_time - accept.start_time == 3_600 * 10**9
    with pytest.raises(ValueError, match="at: naive datetime; pass an aware datetime"):
        h.prepare(at=datetime(2026, 1, 1))
    with pytest.raises(
        TypeError, match="at: expected an aware datetime, int ns since the epoch or None, got str"
    ):
        h.prepare(at="now")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at: must be >= 0 ns"):
        h.prepare(at=-1)
    assert h.state == "running"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"evidence_valid": "yes"}, "evidence_valid: expected bool, got str 'yes'"),
        ({"evidence_count": -1}, "evidence_count: expected int >= 0, got int -1"),
        ({"evidence_count": True}, "evidence_count: expected int >= 0, got bool True"),
        ({"fence_token": "3"}, "fence_token: expected int, got str '3'"),
        ({"state_version": 1.0}, "state_version: expected int, got float 1.0"),
        ({"evidence_refs": "doc:1"}, "evidence_refs: expected a list of ids, got str 'doc:1'"),
        (
            {"evidence_refs": [1]},
            "evidence_refs: expected a list of str ids (or EvidenceRef), got int 1",
        ),
        ({"receipt_status": 200}, "receipt_status: expected str, got int 200"),
        (
            {"extra": {"handoff.to_state": "verified"}},
            "extra: key 'handoff.to_state' is not allowed",
        ),
    ],
)
def test_bad_transition_attributes_are_refused(sender, kw, message):
    rec, tracer = sender
    h = tracer.create(envelope())
    with pytest.raises(ValueError) as ei:
        h.accept(**kw)
    assert message in str(ei.value)
    assert h.state == "created"
    assert len(rec.spans()) == 1


def test_extra_attributes_pass_through(sender):
    rec, tracer = sender
    h = tracer.create(envelope())
    h.accept(extra={"handoff.queue": "q1", "handoff.attempt": 2}, execution_id="run-9")
    row = rec.transitions()[-1]
    assert (row["handoff.queue"], row["handoff.attempt"], row[semconv.EXECUTION_ID]) == (
        "q1",
        2,
        "run-9",
    )


def test_receive_errors(sender, receiver):
    _, s_tracer = sender
    _, r_tracer = receiver
    wire = s_tracer.create(envelope()).to_wire()
    with pytest.raises(EnvelopeError, match="envelope field 'traceparent': not a W3C traceparent"):
        r_tracer.receive({**wire, "traceparent": "00-xyz"})
    with pytest.raises(
        EnvelopeError, match="envelope field 'traceparent': all-zero trace or span id"
    ):
        r_tracer.receive({**wire, "traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"})
    with pytest.raises(EnvelopeError, match="envelope field 'state': unknown state 'done'"):
        r_tracer.receive({**wire, "state": "done"})
    with pytest.raises(EnvelopeError, match="envelope field 'protocol': unsupported major version"):
        r_tracer.receive({**wire, "protocol": "aa-handoff/v2"})
    with pytest.raises(EnvelopeError, match="envelope field 'handoff_id': required field missing"):
        r_tracer.receive({k: v for k, v in wire.items() if k != "handoff_id"})


def test_receive_keeps_wire_state_and_tolerates_missing_traceparent(receiver):
    rec, tracer = receiver
    wire = envelope().to_wire() | {"state": "running"}
    h = tracer.receive(wire)
    assert h.state == "running"
    h.prepare()
    h.commit()
    a, b = rec.spans()
    assert a.context.trace_id == b.context.trace_id == int(h.trace_id, 16)


def test_objective_hashed_and_filtered(sender):
    rec, tracer = sender
    objective = (
        "Deploy with password=hunter2 and key sk-abcdefghijklmnopqrstuvwx; mail ops@example.com; "
        "Authorization: Bearer abc.def.ghijklmnop"
    )
    tracer.create(
        envelope(
            objective=objective,
            constraints={"apiKey": "k-123", "region": "eu", "db": {"Password": "x"}},
        )
    )
    row = rec.transitions()[0]
    assert row[semconv.OBJECTIVE_HASH] == "sha256:" + hashlib.sha256(objective.encode()).hexdigest()
    summary = row[semconv.OBJECTIVE_SUMMARY]
    for secret in ("hunter2", "sk-abcdefghij", "ops@example.com", "abc.def.ghijklmnop"):
        assert secret not in summary
    assert "password=[REDACTED]" in summary
    assert (
        row[semconv.CONSTRAINTS]
        == '{"apiKey":"[REDACTED]","db":{"Password":"[REDACTED]"},"region":"eu"}'
    )


def test_objective_summary_truncated_to_stated_limit(sender):
    rec, _ = sender
    tracer = HandoffTracer(
        "p", tracer_provider=rec.provider, input_filter=InputFilter(max_summary_chars=10)
    )
    tracer.create(envelope(objective="a" * 50))
    assert rec.transitions()[0][semconv.OBJECTIVE_SUMMARY] == "a" * 9 + "…"


def test_custom_and_disabled_filters(sender):
    rec, _ = sender
    custom = InputFilter(patterns=[r"ticket-\d+"], field_names=["region"])
    HandoffTracer("p", tracer_provider=rec.provider, input_filter=custom).create(
        envelope(objective="close ticket-42, password=x", constraints={"region": "eu"})
    )
    off = InputFilter(patterns=(), field_names=())
    HandoffTracer("p", tracer_provider=rec.provider, input_filter=off).create(
        envelope(objective="password=x", constraints={"token": "t"})
    )
    a, b = rec.transitions()
    assert a[semconv.OBJECTIVE_SUMMARY] == "close [REDACTED], password=x"
    assert a[semconv.CONSTRAINTS] == '{"region":"[REDACTED]"}'
    assert b[semconv.OBJECTIVE_SUMMARY] == "password=x"


def test_bad_filter_and_tracer_config():
    with pytest.raises(ValueError, match="patterns: invalid regex '\\('"):
        InputFilter(patterns=["("])
    with pytest.raises(TypeError, match="patterns: expected an iterable of regex strings"):
        InputFilter(patterns="secret")
    with pytest.raises(ValueError, match="max_summary_chars: must be an integer >= 1, got 0"):
        InputFilter(max_summary_chars=0)
    with pytest.raises(ValueError, match="actor: must be a non-empty string"):
        HandoffTracer("")
    with pytest.raises(TypeError, match="input_filter: expected an InputFilter, got dict"):
        HandoffTracer("a", input_filter={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="envelope: expected an Envelope, got dict"):
        HandoffTracer("a").create({"task_id": "t"})  # type: ignore[arg-type]


def test_without_provider_reads_the_global_and_never_sets_it():
    before = trace.get_tracer_provider()
    h = HandoffTracer("a").create(envelope())  # no SDK configured: a no-op, but it works
    h.accept()
    assert trace.get_tracer_provider() is before
    wire = h.to_wire()
    assert "traceparent" not in wire or wire["traceparent"].startswith("00-")


def test_to_wire_is_json_able_and_tracks_state(sender):
    import json

    _, tracer = sender
    h = tracer.create(envelope(constraints={"a": [1, 2]}))
    h.accept()
    wire = json.loads(json.dumps(h.to_wire()))
    assert wire["state"] == "accepted"
    assert wire["traceparent"] == h.traceparent
    assert wire["traceparent"].split("-")[1] == h.trace_id


# -- properties: the tracer keeps every handoff inside the state table -------------------------

_EVENTS = [e for e in Event if e != Event.CREATE]
_PROP_REC = InMemoryRecorder()  # one provider for all examples; cleared per example


@settings(max_examples=150, deadline=None, derandomize=True)
@given(events=st.lists(st.sampled_from(_EVENTS), max_size=25), strict=st.booleans())
def test_any_event_sequence_through_the_tracer_stays_legal(events, strict):
    _PROP_REC.clear()
    tracer = HandoffTracer("p", tracer_provider=_PROP_REC.provider, strict=strict)
    h = tracer.create(envelope())
    expected_spans = 1
    for ev in events:
        before = h.state
        try:
            legal_next = next_state(before, ev)
        except IllegalTransition:
            legal_next = None
        try:
            after = h.transition(ev)
        except IllegalTransition:
            assert strict and legal_next is None
            assert h.state == before
            continue
        expected_spans += 1
        assert after == h.state
        assert h.state in set(State)
        if legal_next is None:  # lenient: emitted flagged, state unchanged
            assert not strict and h.state == before
        else:
            assert h.state == legal_next and (before, ev) in TRANSITIONS
        if before in TERMINAL - {State.COMMITTED}:
            assert h.state == before  # terminal states absorb
    rows = _PROP_REC.transitions()
    assert len(rows) == expected_spans
    # The emitted from/to states chain exactly along the valid spans.
    state = ""
    for row in rows:
        if row.get(semconv.VALID) is False:
            assert row[semconv.FROM_STATE] == state
            continue
        assert row[semconv.FROM_STATE] == state
        state = row[semconv.TO_STATE]
    assert state == h.state


def _table_paths(src: State, dst: State, max_len: int) -> set[tuple[Event, ...]]:
    out: set[tuple[Event, ...]] = set()

    def walk(state: State, path: tuple[Event, ...]) -> None:
        if state == dst and path:
            out.add(path)
        if len(path) == max_len:
            return
        for (s, e), t in TRANSITIONS.items():
            if s == state:
                walk(t, (*path, e))

    walk(src, ())
    return out


_COMMIT_PATHS = _table_paths(State.CREATED, State.COMMITTED, 6)


def test_every_table_path_to_committed_drives_the_tracer_to_committed(sender):
    _, tracer = sender
    assert (Event.ACCEPT, Event.START, Event.COMMIT) in _COMMIT_PATHS
    for i, path in enumerate(sorted(_COMMIT_PATHS)):
        h = tracer.create(envelope(handoff_id=f"h{i}"))
        for ev in path:
            h.transition(ev)
        assert h.state == "committed", path


@settings(max_examples=150, deadline=None, derandomize=True)
@given(events=st.lists(st.sampled_from(_EVENTS), max_size=12))
def test_committed_reached_only_along_table_paths(events):
    _PROP_REC.clear()
    h = HandoffTracer("p", tracer_provider=_PROP_REC.provider).create(envelope())
    taken: list[Event] = []
    for ev in events:
        try:
            h.transition(ev)
        except IllegalTransition:
            continue
        taken.append(ev)
        if h.state == State.COMMITTED and len(taken) <= 6:
            assert tuple(taken) in _COMMIT_PATHS
    assert h.state in NON_TERMINAL | TERMINAL


def test_concurrent_transitions_on_one_handoff_are_serialized(sender):
    import threading

    rec, tracer = sender
    h = tracer.create(envelope())
    wins: list[str] = []
    barrier = threading.Barrier(8)

    def racer() -> None:
        barrier.wait()
        try:
            h.accept()
            wins.append("ok")
        except IllegalTransition:
            pass

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins == ["ok"]
    assert [r[semconv.EVENT] for r in rec.transitions()] == ["create", "accept"]


def test_state_is_read_only(sender):
    _, tracer = sender
    h = tracer.create(envelope())
    with pytest.raises(AttributeError):
        h.state = "committed"
    assert h.state == "created"


def test_tracestate_travels_with_the_traceparent(sender, receiver):
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    _, s_tracer = sender
    r_rec, r_tracer = receiver
    upstream = SpanContext(
        0xABC,
        0xDEF,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )
    with trace.use_span(NonRecordingSpan(upstream)):
        h = s_tracer.create(envelope())
    wire = h.to_wire()
    assert wire["tracestate"] == "vendor=v1"
    r_tracer.receive(wire).accept()
    (accept,) = r_rec.spans()
    assert accept.context.trace_state.get("vendor") == "v1"
    assert accept.context.trace_id == 0xABC
    with pytest.raises(
        EnvelopeError, match="envelope field 'tracestate': must be a string, got int"
    ):
        r_tracer.receive({**wire, "tracestate": 5})
