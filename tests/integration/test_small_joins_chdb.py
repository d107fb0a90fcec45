"""A small OTLP/protobuf request, encoded by the real OTel SDK, is decoded by chDB while a
large one is on its way (so it shares that round's write), and by Python otherwise; either
way every span is stored once, as the other decoder would store it.

In-process: a real Ingestor and Stager on the session's chDB; `receiving()` is what the HTTP
and gRPC handlers wrap around a request from its headers on, so holding it open is a large
request being received.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from foundation.store import StoreSpec, connect
from ingest import SQL_MIN_BYTES, Ingestor, Spool
from ingest._decode import PROTOBUF
from ingest.chdb import Stager
from ingest.testing import transition


def _sdk_body(prefix: str, handoffs: int) -> bytes:
    """One export request of the real SDK: per handoff a create and an accept span."""
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-b"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("small-joins-test")
    for h in range(handoffs):
        for event, frm, to in (("create", "", "created"), ("accept", "created", "accepted")):
            attrs = transition(f"{prefix}-{h}", event, frm, to, task_id=f"t-{prefix}-{h}")
            with tracer.start_as_current_span(f"handoff.{event}", attributes=attrs):
                pass
    provider.shutdown()
    return encode_spans(mem.get_finished_spans()).SerializeToString()


def test_small_requests_join_chdb_only_while_a_large_one_arrives(
    chdb_client, chdb_path: Path, tmp_path: Path, fresh_db: str
):
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / "stage")
    ing = Ingestor(
        chdb_client, fresh_db, Spool(tmp_path / "spool", max_bytes=1 << 30), stager=stager
    )
    ing.start()
    try:
        large = _sdk_body("big", 400)
        small = [_sdk_body(f"s{i}", 3) for i in range(4)]
        assert len(large) >= SQL_MIN_BYTES > max(len(b) for b in small)
        # nothing on its way: a small request goes the Python way
        ing.submit(small[0], PROTOBUF, tenant="default")
        assert ing.health()["sql_decoded"] == 0
        with ing.receiving(PROTOBUF, len(large)):  # the large one's headers are in
            for body in small[1:3]:
                ing.submit(body, PROTOBUF, tenant="default")
            assert ing.health()["sql_decoded"] == 2  # both joined chDB's round
            ing.submit(large, PROTOBUF, tenant="default")
        assert ing.health()["sql_decoded"] == 3
        ing.submit(small[3], PROTOBUF, tenant="default")  # alone again: Python
        h = ing.health()
        assert (h["sql_decoded"], h["sql_declined"]) == (3, 0)
        assert ing.wait_idle(120)
    finally:
        ing.stop()
        stager.close()
    spans = 2 * (400 + 4 * 3)
    rows = chdb_client.query(
        f"SELECT count(), uniqExact(SpanId) FROM {fresh_db}.otel_traces"
    ).result_rows[0]
    assert rows == (spans, spans)  # every acknowledged span, once
    tr = chdb_client.query(
        f"SELECT count(), countIf(valid) FROM {fresh_db}.handoff_transitions"
    ).result_rows[0]
    assert tr == (spans, spans)


def test_a_stager_needs_a_decoding_stream(tmp_path: Path):
    with pytest.raises(ValueError, match="streams must be >= 1, got 0"):
        Stager(lambda: None, tmp_path / "stage", streams=0)  # type: ignore[arg-type,return-value]
