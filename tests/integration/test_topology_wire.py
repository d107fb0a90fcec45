"""The topology attributes (queue position, result items, transfer history, Agent Card,
message kind, replay, compatibility window) through the real OTel SDK and OTLP/HTTP exporter
into a real `handoffs serve`, read back from handoff_transitions.attributes: none refused,
each typed per the storage encoding (int as decimal text, bool true/false, arrays JSON),
the same from one batched request and from one request per span. (serve's SQL decoder takes
string arrays only: a batch holding the int[] `handoff.consumer.supported_versions` is
decoded in Python, as counted by `sql_declined`.)"""

from __future__ import annotations

import json
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from collector import (
    AgentCardRef,
    Envelope,
    HandoffTracer,
    InputFilter,
    QueuePosition,
    ResultItems,
    filter_history,
    replaying,
    semconv,
)
from tests.integration import test_protocol_wire

serve = test_protocol_wire.serve  # the same module-scoped `handoffs serve` fixture

REPS_BATCH = 30
CARD = AgentCardRef("https://coder.example/card", "2026-11-30T10:00:00Z", ("code.write", "ci"))


def emit(provider: TracerProvider, prefix: str, reps: int, t0: int) -> None:
    """Per rep: a queued command consumed by a consumer with a version window, its result
    partial; a transfer with a filtered history; the command replayed."""
    planner = HandoffTracer("planner", tracer_provider=provider)
    coder = HandoffTracer("coder", tracer_provider=provider, supported_versions=(1, 2))
    history = filter_history(["hi", "password=hunter2", "done"], InputFilter(), name="redact")
    for n in range(reps):
        p = f"{prefix}-{n}"
        env = Envelope(task_id=f"{p}-task", handoff_id=f"{p}-q", from_agent="planner",
                       to_agent="coder", mode="delegate", topology="shared_queue",
                       message_kind="command", schema_version=3)  # fmt: skip
        h = planner.create(env, t0, agent_card=CARD)
        work = coder.receive({**h.to_wire(), "tenant_scope": "all"})
        work.accept(t0 + 75_000_000_000, queue=QueuePosition("jobs", t0, 10, 2_010))
        work.start(t0 + 76_000_000_000)
        work.commit(t0 + 77_000_000_000, result_items=ResultItems(5, 2), evidence_valid=True)
        planner.create(
            Envelope(
                **{
                    **env.to_wire(),
                    "handoff_id": f"{p}-t",
                    "topology": "in_process",
                    "mode": "transfer",
                    "message_kind": "event",
                }
            ),
            t0,
            history=history.report,
        )
        with replaying():
            again = planner.create(Envelope(**{**env.to_wire(), "handoff_id": f"{p}-r"}), t0)
            coder.receive(again.to_wire()).reject(t0 + 1000, error_code="conflict")


def _send(srv, prefix: str, reps: int, t0: int, *, batched: bool) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "topology-wire"}))
    exporter = OTLPSpanExporter(f"{srv.otlp_url}/v1/traces")
    if batched:
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=5_000,
                max_export_batch_size=5_000,
                schedule_delay_millis=3_600_000,
            )
        )
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit(provider, prefix, reps, t0)
    provider.force_flush()
    provider.shutdown()
    srv.wait_stored()


def _rows(srv, prefix: str) -> dict[tuple[str, str], dict[str, str]]:
    with srv.client() as c:
        rows = c.query(
            f"SELECT handoff_id, event, attributes FROM {srv.database}.handoff_transitions "
            "WHERE startsWith(handoff_id, {p:String})",
            parameters={"p": f"{prefix}-0-"},
        ).result_rows
    return {
        (hid.removeprefix(f"{prefix}-0-"), ev): {
            k: v.replace(f"{prefix}-0-", "X-") for k, v in a.items()
        }
        for hid, ev, a in rows
    }


def test_topology_attributes_are_stored_typed_batched_or_not(serve):
    t0 = time.time_ns() - 3_600 * 10**9
    _send(serve, "topo-batch", REPS_BATCH, t0, batched=True)
    _send(serve, "topo-one", 1, t0, batched=False)
    with serve.client() as c:
        rejects = c.query(
            f"SELECT count() FROM {serve.database}.ingest_rejects WHERE positionCaseInsensitive("
            "reason, 'handoff.') > 0"
        ).result_rows
        stored = c.query(
            f"SELECT count() FROM {serve.database}.handoff_transitions "
            "WHERE startsWith(handoff_id, 'topo-batch-')"
        ).result_rows
    assert rejects == [(0,)]
    one = _rows(serve, "topo-one")
    assert len(one) == 7  # q: create, accept, start, commit; t: create; r: create, reject
    assert stored == [(7 * REPS_BATCH,)]
    assert _rows(serve, "topo-batch") == one  # batched or not, the same maps

    create = one[("q", "create")]
    assert (create[semconv.MESSAGE_KIND], create[semconv.SCHEMA_VERSION]) == ("command", "3")
    assert create[semconv.AGENT_CARD_URL] == "https://coder.example/card"
    assert create[semconv.AGENT_CARD_FETCHED_AT] == "2026-11-30T10:00:00Z"
    assert json.loads(create[semconv.AGENT_CARD_SKILLS]) == ["code.write", "ci"]
    accept = one[("q", "accept")]
    assert accept[semconv.QUEUE_NAME] == "jobs"
    assert (accept[semconv.QUEUE_LAG_MS], accept[semconv.QUEUE_OFFSET]) == ("75000", "10")
    assert accept[semconv.QUEUE_HEAD_OFFSET] == "2010"
    assert json.loads(accept[semconv.CONSUMER_SUPPORTED_VERSIONS]) == [1, 2]
    assert json.loads(accept[semconv.ENVELOPE_UNKNOWN_FIELDS]) == ["tenant_scope"]
    commit = one[("q", "commit")]
    assert (commit[semconv.RESULT_ITEMS_EXPECTED], commit[semconv.RESULT_ITEMS_RETURNED]) == (
        "5",
        "2",
    )
    transfer = one[("t", "create")]
    assert transfer[semconv.MESSAGE_KIND] == "event"
    assert (
        transfer[semconv.HISTORY_ITEMS],
        transfer[semconv.HISTORY_SENSITIVE_ITEMS],
        transfer[semconv.HISTORY_REMOVED_ITEMS],
        transfer[semconv.INPUT_FILTER],
    ) == ("3", "1", "1", "redact")
    assert semconv.REPLAY not in create and semconv.REPLAY not in transfer
    assert one[("r", "create")][semconv.REPLAY] == "true"
    reject = one[("r", "reject")]
    assert reject[semconv.REPLAY] == "true"
    assert json.loads(reject[semconv.CONSUMER_SUPPORTED_VERSIONS]) == [1, 2]
