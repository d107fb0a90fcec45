"""Too many active parts: serve answers 503 + Retry-After (gRPC UNAVAILABLE + RetryInfo)
before the engine slows or refuses inserts, says why once in its log and on /metrics, and
takes requests again once merges bring the parts back within the limit; nothing it
acknowledged is lost.

serve runs in this process (run_serve in a thread, on the session's chDB), so the test can
stop one table's merges (SYSTEM STOP MERGES): its parts then pile up one per write, by
effect, at a known pace; merging (OPTIMIZE ... FINAL) brings them back.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from foundation.store import StoreSpec
from ingest.testing import request_protobuf, span_json, transition
from serve._run import ServeConfig, run_serve
from serve._tuning import Tuning
from serve.testing import free_port, start_serve, wait_until

PB = {"Content-Type": "application/x-protobuf"}
LIMIT = 3
PILED = "transition_ledger"  # the table whose merges the test stops: it goes over for sure


def _body(i: int) -> bytes:
    s = span_json(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        attributes=transition(f"h-parts-{i}", "create", "", "created"),
        start_ns=time.time_ns(),
    )
    return request_protobuf([s])


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        got = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


@pytest.fixture
def serve_here(chdb_path: Path, fresh_db: str, tmp_path: Path):
    """run_serve on the session store's `fresh_db`, parts limit LIMIT: (OTLP base URL, gRPC
    target)."""
    http, rpc = free_port(), free_port()
    cfg = ServeConfig(
        store=StoreSpec(kind="chdb", path=str(chdb_path), database=fresh_db),
        otlp_port=http,
        grpc_port=rpc,
        query_port=None,
        spool_dir=tmp_path / "spool",
        tuning=Tuning.off(),
        metrics_top_pairs=0,
        derive=False,
        settle_every_s=0,
        max_active_parts=LIMIT,
    )
    ready, stop = threading.Event(), threading.Event()
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(run_serve(cfg, ready=ready, stop=stop)))
    t.start()
    assert ready.wait(60), "serve did not start"
    yield f"http://127.0.0.1:{http}", f"127.0.0.1:{rpc}"
    stop.set()
    t.join(120)
    assert codes == [0], "serve did not drain"


def test_too_many_parts_is_refused_until_merges_catch_up_and_nothing_acked_is_lost(
    serve_here, chdb_client, fresh_db, caplog
):
    base, target = serve_here
    caplog.set_level(logging.WARNING, logger="handoffs.parts")
    chdb_client.command(f"SYSTEM STOP MERGES {fresh_db}.{PILED}")
    s = requests.Session()
    acked: list[int] = []

    def stored() -> None:
        h = s.get(f"{base}/health?wait_s=30", timeout=40).json()
        assert h["queued"] == 0, h

    # each acknowledged request is one write: one more part of the piled table
    refused = None
    deadline = time.monotonic() + 60
    while refused is None and time.monotonic() < deadline:
        i = len(acked)
        r = s.post(f"{base}/v1/traces", data=_body(i), headers=PB, timeout=30)
        if r.status_code == 200:
            acked.append(i)
            stored()
        else:
            refused = (i, r)
    assert refused is not None, f"never refused after {len(acked)} writes"
    i, r = refused
    assert len(acked) > LIMIT  # the table went over the limit before anything was refused
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    m = re.search(r"too many parts: table (\w+) holds (\d+) active parts .*limit (\d+)", r.text)
    assert m and int(m[2]) > LIMIT and int(m[3]) == LIMIT, r.text
    over = m[1]  # the piled table, or another whose merges did not keep up either

    with grpc.insecure_channel(target) as chan, pytest.raises(grpc.RpcError) as err:
        TraceServiceStub(chan).Export(ExportTraceServiceRequest.FromString(_body(1000)), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "too many parts" in err.value.details()

    page = s.get(f"{base}/metrics", timeout=10).text
    refusals = _metric(page, "handoffs_receiver_refused_requests_total", reason="too_many_parts",
                       status="503", transport="http")  # fmt: skip
    assert refusals == 1.0, page
    assert _metric(page, "handoffs_receiver_refused_requests_total", reason="too_many_parts",
                   transport="grpc") == 1.0  # fmt: skip
    piled = _metric(page, "handoffs_store_active_parts", table=over)
    assert piled is not None and piled > LIMIT, page
    assert _metric(page, "handoffs_store_active_parts_limit") == LIMIT
    assert _metric(page, "handoffs_store_parts_refusing") == 1.0

    # merges catch up: the refused request, retried as an exporter would, is taken again
    chdb_client.command(f"SYSTEM START MERGES {fresh_db}.{PILED}")
    for (table,) in chdb_client.query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND engine LIKE '%MergeTree'",
        parameters={"db": fresh_db},
    ).result_rows:
        chdb_client.command(f"OPTIMIZE TABLE {fresh_db}.`{table}` FINAL")
    wait_until(
        lambda: (
            s.post(f"{base}/v1/traces", data=_body(i), headers=PB, timeout=30).status_code == 200
        ),
        30,
        "a request accepted once the parts are merged",
        every=0.2,
    )
    acked.append(i)
    stored()
    page = s.get(f"{base}/metrics", timeout=10).text
    assert _metric(page, "handoffs_store_parts_refusing") == 0.0
    assert (_metric(page, "handoffs_store_active_parts", table=over) or 0) <= LIMIT

    rows = chdb_client.query(
        f"SELECT SpanId, count() FROM {fresh_db}.otel_traces GROUP BY SpanId"
    ).result_rows
    assert dict(rows) == {f"{k + 1:016x}": 1 for k in acked}  # each acknowledged one, once
    lines = [m.getMessage() for m in caplog.records if m.name == "handoffs.parts"]
    assert sum("too many parts: table" in m for m in lines) == 1, lines
    assert sum("accepting requests again" in m for m in lines) == 1, lines


def test_the_limit_is_a_setting_shown_on_metrics(tmp_path: Path):
    serve = start_serve(tmp_path, env={"HANDOFFS_MAX_ACTIVE_PARTS": "7"})
    try:
        page = requests.get(f"{serve.otlp_url}/metrics", timeout=10).text
        assert _metric(page, "handoffs_store_active_parts_limit") == 7.0
        assert _metric(page, "handoffs_store_parts_refusing") == 0.0
    finally:
        assert serve.stop() == 0


def test_a_negative_limit_is_a_usage_error(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "serve", "--store", f"chdb://{tmp_path}/s",
         "--max-active-parts", "-1"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "handoffs serve: --max-active-parts must be 0 or more (parts in one partition), got -1"
    )
    assert not (tmp_path / "s").exists()
