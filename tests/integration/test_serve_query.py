"""serve's ClickHouse HTTP query port through clickhouse-connect, and serve's lifecycle.

The query port is exercised the way the dashboard and CLI use it: query, query_df,
query_arrow, command, raw_query, server-side parameters, settings, compression requests,
errors turned into exceptions. Lifecycle: SIGTERM drains and exits 0; a restart finds an
empty spool and every acknowledged span stored.
"""

from __future__ import annotations

import time

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError

from ingest.testing import request_protobuf, span_json, start_serve, transition


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(tmp_path_factory.mktemp("serve-q"))
    spans = [
        span_json(
            trace_id=f"{i + 1:032x}",
            span_id=f"{i + 1:016x}",
            attributes=transition(f"h-{i % 3}", "create", "", "created", task_id=f"t-{i}"),
            start_ns=time.time_ns() + i,
        )
        for i in range(9)
    ]
    r = requests.post(
        f"{h.otlp_url}/v1/traces",
        data=request_protobuf(spans),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=30,
    )
    assert r.status_code == 200
    h.wait_stored()
    yield h
    assert h.stop() == 0, h.log()


@pytest.mark.parametrize("compress", [False, True, "lz4", "zstd"])
def test_queries_with_every_compression_setting(serve, compress):
    c = clickhouse_connect.get_client(
        host="127.0.0.1", port=serve.query_port, database=serve.database, compress=compress
    )
    rows = c.query(
        "SELECT handoff_id, count() FROM handoff_transitions WHERE tenant = {t:String} "
        "GROUP BY handoff_id ORDER BY handoff_id",
        parameters={"t": "default"},
    ).result_rows
    assert rows == [("h-0", 3), ("h-1", 3), ("h-2", 3)]
    c.close()


def test_dataframes_arrow_command_raw(serve):
    c = serve.client()
    df = c.query_df("SELECT handoff_id, time, capabilities FROM handoff_transitions ORDER BY time")
    assert list(df.columns) == ["handoff_id", "time", "capabilities"] and len(df) == 9
    arrow = c.query_arrow("SELECT count() AS n FROM otel_traces")
    assert arrow.column("n").to_pylist() == [9]
    assert c.command("SELECT count() FROM transition_ledger") == 9
    assert c.raw_query("SELECT 1 AS x FORMAT JSONEachRow").strip() == b'{"x":1}'
    assert c.query("SHOW TABLES").result_rows
    assert c.query("DESCRIBE TABLE ingest_batches").result_rows[0][0] == "ingest_batch"
    assert c.query("EXISTS TABLE otel_traces").result_rows == [(1,)]
    assert c.query("WITH 2 AS k SELECT k * 3").result_rows == [(6,)]
    c.close()


def test_settings_and_other_database(serve):
    c = clickhouse_connect.get_client(host="127.0.0.1", port=serve.query_port, database="system")
    r = c.query(
        "SELECT value FROM settings WHERE name = 'max_threads'", settings={"max_threads": 1}
    )
    assert r.result_rows == [("1",)]
    c.close()


def test_errors_become_clickhouse_exceptions(serve):
    c = serve.client()
    with pytest.raises(DatabaseError) as exc:
        c.query("SELECT no_such_column FROM otel_traces")
    assert exc.value.code == 47  # UNKNOWN_IDENTIFIER
    for sql in (
        "INSERT INTO otel_traces (TraceId) VALUES ('x')",
        "DROP TABLE otel_traces",
        "SET readonly = 0",
    ):
        with pytest.raises(DatabaseError, match="READONLY"):
            c.command(sql)
    assert c.command("SELECT count() FROM otel_traces") == 9  # nothing changed
    c.close()


def test_refused_chunked_insert_leaves_the_connection_in_step(serve):
    """clickhouse-connect streams inserts as a chunked body on a pooled keep-alive
    connection. The port refuses the insert; it must still read the body whole, or the
    leftover chunks are parsed as the next request and the next query on that connection
    gets garbage (seen as BadStatusLine('<!DOCTYPE HTML>'))."""
    c = serve.client()
    try:
        for i in range(5):
            with pytest.raises(DatabaseError, match=r"(?i)readonly|read-only|not allowed|refus"):
                c.insert("otel_traces", [[f"{i:016x}"]], column_names=["SpanId"])
            assert c.query("SELECT count() FROM otel_traces").result_rows[0][0] == 9
    finally:
        c.close()


def test_chunked_query_body_is_read_and_oversized_one_refused(serve):
    def chunks(payload: bytes, size: int = 7):
        for i in range(0, len(payload), size):
            yield payload[i : i + size]

    url = f"http://127.0.0.1:{serve.query_port}/?database={serve.database}"
    with requests.Session() as s:
        r = s.post(url, data=chunks(b"SELECT count() FROM otel_traces"), timeout=30)
        assert (r.status_code, r.text.strip()) == (200, "9")
        r = s.post(
            url, data=chunks(b"SELECT 1 -- " + b"x" * (17 * 1024 * 1024), 1 << 20), timeout=60
        )
        assert r.status_code == 413 and "too large" in r.text


def test_ping_and_plain_http(serve):
    assert requests.get(f"{serve.query_url}/ping", timeout=10).text == "Ok.\n"
    r = requests.get(serve.query_url, params={"query": "SELECT 41 + 1"}, timeout=10)
    assert r.text == "42\n" and r.headers["X-ClickHouse-Format"] == "TabSeparated"
    r = requests.post(serve.query_url, data="DROP DATABASE handoffs", timeout=10)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"


def test_sigterm_drains_and_restart_finds_everything(tmp_path):
    serve = start_serve(tmp_path)
    ids = []
    for k in range(5):
        spans = [
            span_json(
                trace_id=f"{k + 1:016x}{i + 1:016x}",
                span_id=f"{k + 1:08x}{i + 1:08x}",
                attributes=transition(f"h-{k}-{i}", "create", "", "created"),
                start_ns=time.time_ns(),
            )
            for i in range(200)
        ]
        r = requests.post(
            f"{serve.otlp_url}/v1/traces",
            data=request_protobuf(spans),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        assert r.status_code == 200
        ids += [s["spanId"] for s in spans]
    assert serve.stop() == 0  # SIGTERM right after the last 200
    assert "stopped (drained)" in serve.log()
    again = start_serve(tmp_path, store_dir=serve.store_dir)
    assert "replayed" not in again.log()
    c = again.client()
    stored = c.query("SELECT SpanId FROM otel_traces").result_rows
    assert sorted(s for (s,) in stored) == sorted(ids)
    c.close()
    assert again.stop() == 0
