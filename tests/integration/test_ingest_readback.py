"""Spans from the real OTel SDK, stored and read back; one suite over two stores.

- embedded: the in-process chDB client on the session path, fed through the same pure
  ingest functions serve uses (decode_request + write_batch via ingest_requests);
- http: the real OTLPSpanExporter -> `handoffs serve` (subprocess) -> read back with
  clickhouse-connect's HTTP client on serve's query port.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from foundation.integrity import GENESIS, batch_hash, chain, row_hash
from foundation.store import apply_schema, connect, parse_store
from ingest import ingest_requests
from ingest.testing import transition
from serve.testing import start_serve

LIFECYCLE: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "create",
        "",
        "created",
        {"handoff.deadline_ms": 60_000, "handoff.capabilities": ["search", "cite"]},
    ),
    ("accept", "created", "accepted", {}),
    ("start", "accepted", "running", {}),
    (
        "commit",
        "running",
        "committed",
        {"handoff.evidence.count": 2, "handoff.evidence.valid": True},
    ),
    ("verify", "committed", "verified", {"handoff.receipt.status": "ok"}),
    ("cancel", "verified", "canceled", {}),  # illegal after a terminal state: stored, flagged
]


def _emit(provider: TracerProvider, handoffs: int) -> None:
    tracer = provider.get_tracer("readback-test", "1.0")
    for h in range(handoffs):
        with tracer.start_as_current_span("task"):
            for event, frm, to, extra in LIFECYCLE:
                attrs = transition(f"h-{h}", event, frm, to, task_id=f"task-{h}")
                attrs.update(extra)
                with tracer.start_as_current_span(f"handoff.{event}", attributes=attrs):
                    pass


class _Store:
    """Run SQL with `{db}.` table prefixes on either store."""

    def __init__(self, client, db_prefix: str) -> None:
        self.client = client
        self.prefix = db_prefix

    def rows(self, sql: str, **params):
        return self.client.query(sql.replace("{db}.", self.prefix), parameters=params).result_rows


HANDOFFS = 4


_SERVER = os.environ.get("HANDOFFS_TEST_CLICKHOUSE_URL")


@pytest.fixture(
    scope="module",
    params=[
        "embedded",
        "http",
        pytest.param(
            "server",
            marks=pytest.mark.skipif(not _SERVER, reason="HANDOFFS_TEST_CLICKHOUSE_URL not set"),
        ),
    ],
)
def store(request, tmp_path_factory, chdb_client):
    resource = Resource.create({"service.name": "agent-b", "deployment.environment": "test"})
    provider = TracerProvider(resource=resource)
    if request.param == "server":  # a real ClickHouse server, same pure ingest path
        client = connect(parse_store(_SERVER), database="")
        db = f"t_readback_{uuid.uuid4().hex[:8]}"
        apply_schema(client, db)
        mem = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(mem))
        _emit(provider, HANDOFFS)
        body = encode_spans(mem.get_finished_spans()).SerializeToString()
        ingest_requests(client, db, [("protobuf", body, "memory")], source="test")
        yield _Store(client, f"{db}.")
        client.command(f"DROP DATABASE IF EXISTS {db}")
        client.close()
    elif request.param == "embedded":
        db = f"t_readback_{uuid.uuid4().hex[:8]}"
        apply_schema(chdb_client, db)
        mem = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(mem))
        _emit(provider, HANDOFFS)
        body = encode_spans(mem.get_finished_spans()).SerializeToString()
        summary = ingest_requests(chdb_client, db, [("protobuf", body, "memory")], source="test")
        assert summary.stored == HANDOFFS * (len(LIFECYCLE) + 1)
        yield _Store(chdb_client, f"{db}.")
        chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    else:
        serve = start_serve(tmp_path_factory.mktemp("readback"))
        exporter = OTLPSpanExporter(endpoint=f"{serve.otlp_url}/v1/traces", timeout=30)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=7))
        _emit(provider, HANDOFFS)
        assert provider.force_flush(30_000)
        serve.wait_stored()
        client = serve.client()
        yield _Store(client, "")
        client.close()
        assert serve.stop() == 0
    provider.shutdown()


def test_every_span_is_stored_once(store):
    n, distinct = store.rows("SELECT count(), uniqExact(SpanId) FROM {db}.otel_traces")[0]
    assert n == distinct == HANDOFFS * (len(LIFECYCLE) + 1)
    assert store.rows("SELECT count() FROM {db}.handoff_transitions")[0][0] == HANDOFFS * len(
        LIFECYCLE
    )


def test_transitions_are_typed_and_flagged(store):
    rows = store.rows(
        "SELECT event, from_state, to_state, valid, capabilities, deadline_ms, evidence_count, "
        "evidence_valid, receipt_status, tenant, service_name, span_name "
        "FROM {db}.handoff_transitions WHERE handoff_id = 'h-1' ORDER BY time"
    )
    assert [r[0] for r in rows] == [e for e, *_ in LIFECYCLE]
    create, _, _, commit, verify, cancel = rows
    assert create[4] == ["search", "cite"] and create[5] == 60_000
    assert commit[6] == 2 and commit[7] is True
    assert verify[8] == "ok"
    assert [r[3] for r in rows] == [True] * 5 + [False]
    assert {r[9] for r in rows} == {"default"}
    assert {r[10] for r in rows} == {"agent-b"}
    assert cancel[11] == "handoff.cancel"


def test_otel_columns_match_the_collector_exporter(store):
    rows = store.rows(
        "SELECT SpanKind, StatusCode, ScopeName, ScopeVersion, ResourceAttributes['deployment.environment'], "
        "length(TraceId), length(SpanId), Duration > 0, "
        "SpanAttributes['handoff.capabilities'], SpanAttributes['handoff.evidence.valid'] "
        "FROM {db}.otel_traces WHERE SpanName = 'handoff.create' LIMIT 1"
    )
    assert rows[0][:8] == ("Internal", "Unset", "readback-test", "1.0", "test", 32, 16, True)
    assert rows[0][8] == '["search","cite"]'
    parents = store.rows(
        "SELECT count() FROM {db}.otel_traces t WHERE SpanName LIKE 'handoff.%' "
        "AND ParentSpanId IN (SELECT SpanId FROM {db}.otel_traces WHERE SpanName = 'task')"
    )
    assert parents[0][0] == HANDOFFS * len(LIFECYCLE)


def test_ledger_hashes_match_the_stored_transitions(store):
    stored = store.rows(
        "SELECT tenant, toUnixTimestamp64Nano(time), trace_id, span_id, task_id, handoff_id, event, "
        "from_state, to_state, actor, attributes FROM {db}.handoff_transitions"
    )
    cols: tuple[str, ...] = ("tenant", "time_ns", "trace_id", "span_id", "task_id", "handoff_id")
    cols += ("event", "from_state", "to_state", "actor", "attributes")
    recomputed = {r[3]: row_hash(dict(zip(cols, r, strict=True))) for r in stored}
    ledger = {
        s: (h.decode() if isinstance(h, bytes) else h)
        for s, h in store.rows("SELECT span_id, row_hash FROM {db}.transition_ledger")
    }
    assert ledger == recomputed


def test_batches_form_one_hash_chain(store):
    batches = store.rows(
        "SELECT ingest_batch, prev_chain_hash, chain_hash, batch_hash, transitions FROM {db}.ingest_batches"
    )
    dec = [tuple(x.decode() if isinstance(x, bytes) else x for x in b) for b in batches]
    by_prev = {b[1]: b for b in dec}
    link, seen = GENESIS, 0
    while link in by_prev:
        bid, prev, ch, bh, _ = by_prev[link]
        ledger = [
            (h.decode() if isinstance(h, bytes) else h)
            for (h,) in store.rows(
                "SELECT row_hash FROM {db}.transition_ledger WHERE ingest_batch = {b:String}", b=bid
            )
        ]
        assert ch == chain(prev, bh)
        assert len(ledger) == by_prev[link][4]
        assert bh == batch_hash(sorted(ledger))
        link, seen = ch, seen + 1
    assert seen == len(dec)
