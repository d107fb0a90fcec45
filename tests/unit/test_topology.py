"""Each topology's own attributes: the pure helpers on plain values, then through the tracer
on the real OTel SDK (in-memory recorder): typed attributes, refusals, the replay context."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from collector import (
    AgentCardRef,
    Envelope,
    HandoffTracer,
    HistoryReport,
    InMemoryRecorder,
    InputFilter,
    QueuePosition,
    ResultItems,
    compatibility,
    filter_history,
    is_replaying,
    replaying,
    result_items,
    semconv,
)
from collector._attrs import TRANSITION_KEYWORDS

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
NS0 = 1_796_119_200_000_000_000  # T0 in ns


def env(**kw) -> Envelope:
    base = dict(
        task_id="t1", handoff_id="h1", from_agent="planner", to_agent="coder", mode="delegate"
    )
    return Envelope(**{**base, **kw})


@pytest.fixture
def rec():
    r = InMemoryRecorder()
    yield r
    r.shutdown()


# -- pure helpers ---------------------------------------------------------------------------


def test_queue_lag_is_enqueue_to_consume_in_ms_and_never_negative():
    pos = QueuePosition("jobs", T0, offset=40, head_offset=45)
    assert pos.lag_ms(NS0 + 2_500_000_000) == 2_500
    assert pos.lag_ms(NS0 + 999_999) == 0  # under a millisecond
    assert pos.lag_ms(NS0 - 5_000_000_000) == 0  # the consumer's clock is behind: skew
    assert QueuePosition("jobs", NS0, 0, 0).lag_ms(NS0 + 61_000_000_000) == 61_000


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"queue": ""}, "queue: expected a non-empty str"),
        ({"enqueued_at": datetime(2026, 12, 1)}, "enqueued_at: expected an aware datetime"),
        ({"enqueued_at": "2026-12-01T10:00:00Z"}, "enqueued_at: expected an aware datetime"),
        ({"offset": -1}, "offset: expected int >= 0"),
        ({"head_offset": 1.0}, "head_offset: expected int >= 0"),
        ({"offset": 9, "head_offset": 8}, "head_offset: the newest position (8) is behind"),
    ],
)
def test_queue_position_refuses_bad_fields(kw, message):
    base = dict(queue="jobs", enqueued_at=T0, offset=1, head_offset=2)
    with pytest.raises(ValueError) as ei:
        QueuePosition(**{**base, **kw})
    assert message in str(ei.value)


def test_result_items_counts_non_empty_items_or_named_fields():
    assert result_items(["a", "", None, "b"], 5) == ResultItems(5, 2)
    assert result_items(["a", "b", "c"], 3).partial is False
    r = result_items({"summary": "ok", "risks": [], "citations": ["x"], "other": 1},
                     ("summary", "risks", "citations"))  # fmt: skip
    assert (r.expected, r.returned, r.partial) == (3, 2, True)
    assert r.attributes() == {semconv.RESULT_ITEMS_EXPECTED: 3, semconv.RESULT_ITEMS_RETURNED: 2}
    with pytest.raises(ValueError, match="result: expected a sequence"):
        result_items("abc", 3)
    with pytest.raises(ValueError, match="result: expected a mapping"):
        result_items(["a"], ("summary",))
    with pytest.raises(ValueError, match="expected: expected int >= 0"):
        ResultItems(-1, 0)
    with pytest.raises(ValueError, match="returned: expected int >= 0"):
        ResultItems(1, True)


HISTORY = (
    "user: please fix the login test",
    "user: my password=hunter2 if you need it",
    {"role": "tool", "api_key": "abc"},
    "assistant: on it",
)


def test_filter_history_counts_items_sensitive_and_removed():
    def drop_secrets(items):
        return [i for i in items if i != HISTORY[1]]

    f = filter_history(HISTORY, drop_secrets)
    assert f.kept == (HISTORY[0], HISTORY[2], HISTORY[3])
    assert f.report == HistoryReport(
        4, 2, 1, "test_filter_history_counts_items_sensitive_and_removed.<locals>.drop_secrets"
    )
    # an InputFilter redacts: both sensitive items change, so both count as removed
    red = filter_history(HISTORY, InputFilter())
    assert red.report == HistoryReport(4, 2, 2, "InputFilter")
    assert "hunter2" not in str(red.kept)
    # no filter: nothing removed, the name is empty
    none = filter_history(HISTORY, name=None)
    assert none.report == HistoryReport(4, 2, 0, "")
    assert none.kept == HISTORY
    # duplicates are compared as a multiset; a custom detector; a name given
    dup = filter_history(["a", "a", "b"], lambda items: ["a", "b"], name="dedup",
                         detector=InputFilter(patterns=("b",)))  # fmt: skip
    assert dup.report == HistoryReport(3, 1, 1, "dedup")


def test_filter_history_refusals():
    with pytest.raises(ValueError, match="history: expected a list of items, got str"):
        filter_history("one message")
    with pytest.raises(ValueError, match="input_filter: returned NoneType"):
        filter_history(["a"], lambda items: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="input_filter: expected an InputFilter or a callable"):
        filter_history(["a"], 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name: expected a non-empty str"):
        filter_history(["a"], lambda items: items, name="")
    with pytest.raises(ValueError, match="items: 1 is fewer than"):
        HistoryReport(1, 2, 0)


def test_agent_card_ref_validates_and_compatibility_reads_the_envelope():
    card = AgentCardRef("https://coder.example/.well-known/agent-card.json",
                        "2026-11-30T10:00:00Z", ["code.write", "code.review"])  # type: ignore[arg-type]  # fmt: skip
    assert card.skills == ("code.write", "code.review")
    with pytest.raises(ValueError, match="fetched_at: not an ISO-8601 UTC time"):
        AgentCardRef("https://x", "2026-11-30 10:00")
    with pytest.raises(ValueError, match="skills: expected a list of str"):
        AgentCardRef("https://x", "2026-11-30T10:00:00Z", "code.write")  # type: ignore[arg-type]
    e = Envelope.from_wire({**env(schema_version=3).to_wire(), "tenant": "b", "grant_v2": {}})
    c = compatibility(e, [1, 2])
    assert (c.schema_version, c.supported_versions, c.unknown_fields) == (
        3,
        (1, 2),
        ("grant_v2", "tenant"),
    )
    assert c.compatible is False
    assert compatibility(env(), [2]).compatible is True  # no version given: taken as supported
    with pytest.raises(ValueError, match="supported_versions: expected int >= 0"):
        compatibility(e, ["1"])  # type: ignore[list-item]


def test_envelope_message_kind_and_schema_version_are_validated():
    assert env(message_kind="command", schema_version=2).to_wire()["schema_version"] == 2
    with pytest.raises(ValueError, match=r"message_kind.*unknown kind 'order'"):
        env(message_kind="order")
    with pytest.raises(ValueError, match=r"schema_version.*must be an integer"):
        env(schema_version="2")


def test_replaying_nests_and_is_per_task():
    assert not is_replaying()
    with replaying():
        with replaying():
            assert is_replaying()
        assert is_replaying()

        seen = []
        other = threading.Thread(target=lambda: seen.append(is_replaying()))
        other.start()
        other.join()
        assert seen == [False]  # another thread is not replaying

        async def task():
            return is_replaying()

        assert asyncio.run(task()) is True  # a task started inside inherits the context
    assert not is_replaying()


# -- through the tracer ---------------------------------------------------------------------


def test_each_topology_attribute_reaches_its_span_typed(rec):
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    coder = HandoffTracer("coder", tracer_provider=rec.provider, supported_versions=[1, 2])
    hist = filter_history(HISTORY, InputFilter(), name="redact-secrets")
    card = AgentCardRef("https://coder.example/card", "2026-11-30T10:00:00Z", ("code.write",))
    h = planner.create(env(message_kind="command", schema_version=2, topology="shared_queue"),
                       NS0, history=hist.report, agent_card=card)  # fmt: skip
    wire = {**h.to_wire(), "risk_level": "high"}
    work = coder.receive(wire)
    work.accept(NS0 + 90_000_000_000, queue=QueuePosition("jobs", NS0, 7, 1_500))
    work.start()
    work.commit(result_items=ResultItems(5, 3), receipt_status="ok")
    create, accept, _start, commit = rec.transitions()
    assert create[semconv.MESSAGE_KIND] == "command" and create[semconv.SCHEMA_VERSION] == 2
    assert (create[semconv.HISTORY_ITEMS], create[semconv.HISTORY_SENSITIVE_ITEMS],
            create[semconv.HISTORY_REMOVED_ITEMS], create[semconv.INPUT_FILTER]) == (
        4, 2, 2, "redact-secrets")  # fmt: skip
    assert create[semconv.AGENT_CARD_SKILLS] == ("code.write",)
    assert create[semconv.AGENT_CARD_FETCHED_AT] == "2026-11-30T10:00:00Z"
    assert (accept[semconv.QUEUE_NAME], accept[semconv.QUEUE_LAG_MS]) == ("jobs", 90_000)
    assert (accept[semconv.QUEUE_OFFSET], accept[semconv.QUEUE_HEAD_OFFSET]) == (7, 1_500)
    assert accept[semconv.CONSUMER_SUPPORTED_VERSIONS] == (1, 2)
    assert accept[semconv.ENVELOPE_UNKNOWN_FIELDS] == ("risk_level",)
    assert semconv.CONSUMER_SUPPORTED_VERSIONS not in commit  # only on accept / reject
    assert (commit[semconv.RESULT_ITEMS_EXPECTED], commit[semconv.RESULT_ITEMS_RETURNED]) == (5, 3)
    assert all(semconv.REPLAY not in t for t in rec.transitions())
    from tests.unit.test_tracer import assert_wire_types

    for t in rec.transitions():
        assert_wire_types(t)


def test_explicit_window_keywords_win_and_a_refused_envelope_carries_the_window(rec):
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    coder = HandoffTracer("coder", tracer_provider=rec.provider, supported_versions=(3,))
    wire = planner.create(env(schema_version=3)).to_wire()
    coder.receive(wire).reject(supported_versions=[4], unknown_fields=["x"], error_code="busy")
    assert rec.transitions()[-1][semconv.CONSUMER_SUPPORTED_VERSIONS] == (4,)
    assert rec.transitions()[-1][semconv.ENVELOPE_UNKNOWN_FIELDS] == ("x",)
    with pytest.raises(ValueError):
        coder.receive({**wire, "handoff_id": "h2", "mode": "fork", "quota": 1})
    refused = rec.transitions()[-1]
    assert (refused[semconv.EVENT], refused[semconv.HANDOFF_ID]) == ("reject", "h2")
    assert refused[semconv.CONSUMER_SUPPORTED_VERSIONS] == (3,)
    assert refused[semconv.ENVELOPE_UNKNOWN_FIELDS] == ("quota",)


def test_every_transition_inside_replaying_is_marked(rec):
    planner = HandoffTracer("planner", tracer_provider=rec.provider)
    live = planner.create(env(handoff_id="live"))
    with replaying():
        h = planner.create(env(message_kind="command"))
        h.accept()
        h.start()
        live.accept()
        live.redeliver()
    live.start()
    live.redeliver()
    marks = [
        (t[semconv.HANDOFF_ID], t[semconv.EVENT], t.get(semconv.REPLAY)) for t in rec.transitions()
    ]
    assert marks == [
        ("live", "create", None),
        ("h1", "create", True),
        ("h1", "accept", True),
        ("h1", "start", True),
        ("live", "accept", True),
        ("live", "accept", True),
        ("live", "start", None),
        ("live", "start", None),
    ]


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"queue": ("jobs", 1)}, ValueError, "queue: expected a QueuePosition, got tuple"),
        ({"result_items": (5, 3)}, ValueError, "result_items: expected a ResultItems"),
        ({"supported_versions": "1,2"}, ValueError, "supported_versions: expected a list of int"),
        ({"supported_versions": [1, -2]}, ValueError, "supported_versions: expected int >= 0"),
        ({"unknown_fields": [1]}, ValueError, "unknown_fields: expected a list of str, got int 1"),
        ({"extra": ["k"]}, ValueError, "extra: expected a mapping"),
        ({"queue_name": "jobs"}, TypeError, "unexpected keyword argument 'queue_name'"),
    ],
)
def test_wrong_types_of_the_new_keywords_are_refused_before_any_span(rec, kw, error, message):
    h = HandoffTracer("planner", tracer_provider=rec.provider).create(env())
    with pytest.raises(error) as ei:
        h.accept(**kw)
    assert message in str(ei.value)
    assert h.state == "created" and len(rec.spans()) == 1


def test_create_and_tracer_refuse_wrong_types(rec):
    t = HandoffTracer("planner", tracer_provider=rec.provider)
    with pytest.raises(TypeError, match="history: expected a HistoryReport, got dict"):
        t.create(env(), history={"items": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="agent_card: expected an AgentCardRef, got str"):
        t.create(env(), agent_card="https://x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="supported_versions: expected a list of int"):
        HandoffTracer("c", tracer_provider=rec.provider, supported_versions=2)  # type: ignore[arg-type]
    assert rec.spans() == ()


def test_the_keyword_table_covers_the_transition_signature():
    assert {
        "queue",
        "result_items",
        "result_fields",
        "supported_versions",
        "unknown_fields",
        "extra",
    } <= TRANSITION_KEYWORDS
    assert len(TRANSITION_KEYWORDS) == 23
