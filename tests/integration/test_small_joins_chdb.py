"""A small or mid-size OTLP/protobuf request, encoded by the real OTel SDK, is decoded by
chDB while another request of SQL_JOIN_MIN_BYTES or more is on its way (so they share that
round's write), and by Python when it comes alone (a sender waiting for each answer); a
large one always by chDB. Either way every span is stored once, as the other decoder would
store it.

In-process: a real Ingestor and Stager on the session's chDB; `receiving()` is what the HTTP
and gRPC handlers wrap around a request from its headers on, so holding it open is a
request being received; the other requests come on other threads, as on other connections.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from foundation.store import StoreSpec, connect
from ingest import SQL_JOIN_MIN_BYTES, SQL_MIN_BYTES, Ingestor, Spool
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


def test_requests_join_chdb_only_while_another_is_on_its_way(
    chdb_client, chdb_path: Path, tmp_path: Path, fresh_db: str
):
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / "stage")
    ing = Ingestor(
        chdb_client, fresh_db, Spool(tmp_path / "spool", max_bytes=1 << 30), stager=stager
    )
    ing.start()
    try:
        large = _sdk_body("big", 800)
        mid = [_sdk_body(f"m{i}", 200) for i in range(3)]
        small = [_sdk_body(f"s{i}", 3) for i in range(4)]
        assert len(large) >= SQL_MIN_BYTES > max(len(b) for b in mid)
        assert min(len(b) for b in mid) >= SQL_JOIN_MIN_BYTES > max(len(b) for b in small)

        def send(body: bytes) -> None:  # on a connection of its own
            with ing.receiving(PROTOBUF, len(body)):
                ing.submit(body, PROTOBUF, tenant="default")

        with ThreadPoolExecutor(1) as other:
            # nothing else on its way: a small request, then a mid-size one, go the Python way
            send(small[0])
            send(mid[0])
            assert ing.health()["sql_decoded"] == 0
            with ing.receiving(PROTOBUF, len(mid[1])):  # a mid-size one's headers are in
                for body in small[1:3]:
                    other.submit(send, body).result()
                assert ing.health()["sql_decoded"] == 2  # both joined chDB's round
                ready, go = threading.Event(), threading.Event()

                def second_sender() -> None:  # its request in flight with mid[1]
                    with ing.receiving(PROTOBUF, len(mid[2])):
                        ready.set()
                        assert go.wait(30)
                        ing.submit(mid[2], PROTOBUF, tenant="default")

                sent = other.submit(second_sender)
                assert ready.wait(30)
                ing.submit(mid[1], PROTOBUF, tenant="default")
                go.set()
                sent.result()
            assert ing.health()["sql_decoded"] == 4
            send(large)  # alone, but large: chDB
            assert ing.health()["sql_decoded"] == 5
            send(small[3])  # alone again: Python
        h = ing.health()
        assert (h["sql_decoded"], h["sql_declined"]) == (5, 0)
        assert ing.wait_idle(120)
    finally:
        ing.stop()
        stager.close()
    spans = 2 * (800 + 3 * 200 + 4 * 3)
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
