"""Requests of several tenants written as one group: each row keeps its own tenant, the
chain verifies, and a request the store refuses parks no other tenant's request.

In-process: a real Ingestor on the session's chDB (Python decoder, and chDB decoding every
request), with a backend that holds the first write so that the requests submitted
meanwhile are taken in one round (tests/integration/_backends.Gated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from foundation.store import StoreSpec, connect
from ingest import Ingestor, Spool, verify_chain
from ingest._decode import PROTOBUF
from ingest.chdb import Stager
from ingest.testing import create_spans, request_protobuf, transition
from tests.integration._backends import Gated

_SPANS = 4


def _body(k: int) -> bytes:
    return request_protobuf(create_spans(k, _SPANS, prefix="h-ten"))


@pytest.fixture(params=["python", "chdb"])
def make_ingestor(request, chdb_client, chdb_path: Path, tmp_path: Path, fresh_db: str):
    """Factory: a started Ingestor on `fresh_db` with the given backend; stopped
    afterwards. `chdb`: chDB decodes every request."""
    made: list[Ingestor] = []
    stagers: list[Stager] = []

    def make(writer: Gated) -> Ingestor:
        kw: dict[str, Any] = {}
        if request.param == "chdb":
            spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
            stagers.append(Stager(lambda: connect(spec, database=""), tmp_path / "stage"))
            kw = {"stager": stagers[-1], "sql_min_bytes": 1}
        ing = Ingestor(
            chdb_client,
            fresh_db,
            Spool(tmp_path / "spool", max_bytes=1 << 30),
            backend=writer,
            max_refusals=2,
            **kw,
        )
        ing.start()
        made.append(ing)
        return ing

    yield make
    for ing in made:
        ing.stop()
    for s in stagers:
        s.close()


def _tenants_of(client, db: str, table: str, column: str = "tenant") -> dict[str, int]:
    rows = client.query(f"SELECT {column}, count() FROM {db}.{table} GROUP BY {column}")
    return dict(rows.result_rows)


def _round(ing: Ingestor, writer: Gated, tenants: list[str]) -> None:
    """One request of tenant "a" whose write is held, then `tenants`' requests (queued
    meanwhile, so the writer takes them together), then release and drain."""
    ing.submit(_body(0), PROTOBUF, tenant="a")
    assert writer.entered.wait(60)
    for k, t in enumerate(tenants, 1):
        ing.submit(_body(k), PROTOBUF, tenant=t)
    writer.release.set()
    assert ing.wait_idle(120)


def test_requests_of_several_tenants_are_one_write_each_row_keeping_its_tenant(
    chdb_client, fresh_db, make_ingestor
):
    writer = Gated(chdb_client, fresh_db)
    ing = make_ingestor(writer)
    _round(ing, writer, ["b", "a", "c", "b"])
    assert writer.groups == [["a"], ["b", "a", "c", "b"]]  # one write for the four
    expect = {"a": 2 * _SPANS, "b": 2 * _SPANS, "c": _SPANS}
    assert _tenants_of(chdb_client, fresh_db, "handoff_transitions") == expect
    assert _tenants_of(chdb_client, fresh_db, "transition_ledger") == expect
    assert _tenants_of(chdb_client, fresh_db, "otel_traces", "Tenant") == expect
    assert _tenants_of(chdb_client, fresh_db, "ingest_batches") == {"a": 2, "b": 2, "c": 1}
    by_batch = chdb_client.query(
        f"SELECT uniqExact(t.tenant), any(t.tenant) = any(b.tenant) FROM {fresh_db}.otel_traces "
        f"AS o INNER JOIN {fresh_db}.ingest_batches AS b ON o.IngestBatch = b.ingest_batch "
        f"INNER JOIN {fresh_db}.handoff_transitions AS t ON t.span_id = o.SpanId "
        "GROUP BY o.IngestBatch"
    ).result_rows
    assert len(by_batch) == 5 and all(row == (1, True) for row in by_batch), by_batch
    report = verify_chain(chdb_client, fresh_db)
    assert report.ok and report.batches == 5, report


def test_a_request_the_store_refuses_parks_no_other_tenants_request(
    chdb_client, fresh_db, make_ingestor, tmp_path
):
    writer = Gated(chdb_client, fresh_db, refuse_tenant="b")
    ing = make_ingestor(writer)
    _round(ing, writer, ["a", "b", "c"])
    h = ing.health()
    assert (h["split_groups"], h["parked_batches"], h["batches"]) == (1, 1, 3), h
    # the group of three was refused (twice or more: max_refusals), then each request went
    # alone: b's refused twice and parked
    tried = writer.groups[1:]
    assert tried[-4:] == [["a"], ["b"], ["b"], ["c"]], tried
    assert len(tried) >= 6 and all(g == ["a", "b", "c"] for g in tried[:-4]), tried
    assert _tenants_of(chdb_client, fresh_db, "handoff_transitions") == {
        "a": 2 * _SPANS,
        "c": _SPANS,
    }
    (meta,) = (tmp_path / "spool" / "dead").glob("*.json")
    assert '"tenant": "b"' in meta.read_text()
    report = verify_chain(chdb_client, fresh_db)
    assert report.ok and report.batches == 3, report


def test_real_sdk_exporters_of_three_tenants_at_once_keep_their_tenants(tmp_path):
    """The OpenTelemetry SDK's own OTLP/HTTP exporter, one per tenant token, exporting from
    three threads at once into one `handoffs serve`: every span stored once under its
    exporter's tenant, every batch chained."""
    import threading

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from serve.testing import start_serve

    tenants = ("a", "b", "c")
    serve = start_serve(tmp_path, ",".join(f"tok-{t}={t}" for t in tenants))
    per_tenant = 60

    def emit(tenant: str) -> None:
        exporter = OTLPSpanExporter(
            endpoint=f"{serve.otlp_url}/v1/traces",
            headers={"Authorization": f"Bearer tok-{tenant}"},
            timeout=30,
        )
        provider = TracerProvider(resource=Resource.create({"service.name": f"agent-{tenant}"}))
        provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=8))
        tracer = provider.get_tracer("tenants-test")
        for i in range(per_tenant):
            attrs = transition(f"h-{tenant}-{i}", "create", "", "created", task_id=f"t-{i}")
            with tracer.start_as_current_span("handoff.create", attributes=attrs):
                pass
        provider.shutdown()  # flushes every batch

    try:
        threads = [threading.Thread(target=emit, args=(t,)) for t in tenants]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        health = serve.wait_stored()
        client = serve.client()
        got = _tenants_of(client, serve.database, "handoff_transitions")
        assert got == {t: per_tenant for t in tenants}, (got, health)
        wrong = client.query(
            f"SELECT count() FROM {serve.database}.handoff_transitions "
            "WHERE NOT startsWith(handoff_id, concat('h-', tenant, '-'))"
        ).result_rows
        assert wrong == [(0,)]
        report = verify_chain(client, serve.database)
        assert report.ok and report.batches == health["batches"], report
        client.close()
    finally:
        assert serve.stop() == 0
