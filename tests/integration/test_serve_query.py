"""serve's ClickHouse HTTP query port through clickhouse-connect, and serve's lifecycle.

The query port is exercised the way the dashboard and CLI use it: query, query_df,
query_arrow, command, raw_query, server-side parameters (small ones in the URL, large ones
in a multipart form), settings, compression requests, compressed bodies, errors turned into
exceptions; its limits (time, memory, result size, threads, concurrency) and the
cancelling of a query whose client went away; request bodies read whole or the connection
closed. Lifecycle: SIGTERM drains and exits 0; a restart finds an empty spool and every
acknowledged span stored.
"""

from __future__ import annotations

import gzip
import socket
import time
import zlib

import clickhouse_connect
import lz4.frame
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError
from urllib3 import encode_multipart_formdata

from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[no-redef]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    # the transport itself (compression, request forms, framing): an open port; read tokens
    # are tests/reliability/test_query_port_auth.py's and test_read_token_default.py's
    h = start_serve(tmp_path_factory.mktemp("serve-q"), query_port_open=True)
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


# ------------------------------------------------------------------ request forms


def _ids(n: int) -> list[str]:
    """`n` ids of ~40 characters (as the dashboard's): 80 of them fit clickhouse-connect's
    4 KB of URL parameters, 100 do not."""
    return [f"h-{i}" if i < 3 else f"no-such-handoff-{i:06d}-0123456789abcdef" for i in range(n)]


@pytest.mark.parametrize("n", [80, 100, 5000])
@pytest.mark.parametrize("form", [False, True])
def test_large_bound_parameters_work_through_clickhouse_connect(serve, n, form):
    """Past ~4 KB of bound parameters clickhouse-connect sends the query and its parameters
    as a multipart/form-data body (or always, with form_encode_query_params): the port reads
    the form (regression: it read the form's bytes as SQL and refused it as several
    statements)."""
    c = serve.client(form_encode_query_params=form)
    try:
        sql = "SELECT count() FROM handoff_transitions WHERE handoff_id IN {ids:Array(String)}"
        ids = _ids(n)
        assert c.query(sql, parameters={"ids": ids}).result_rows == [(9,)]
        assert c.command(sql, parameters={"ids": ids}) == 9
        assert c.raw_query(sql + " FORMAT TSV", parameters={"ids": ids}).strip() == b"9"
        df = c.query_df(
            "SELECT handoff_id, count() AS n FROM handoff_transitions "
            "WHERE handoff_id IN {ids:Array(String)} GROUP BY handoff_id ORDER BY handoff_id",
            parameters={"ids": ids},
        )
        assert list(df["n"]) == [3, 3, 3]
    finally:
        c.close()


def test_every_raw_request_form(serve):
    url = serve.query_url + "/"
    sql = b"SELECT count() FROM handoff_transitions WHERE handoff_id IN {ids:Array(String)}"
    ids = "[" + ",".join(f"'{i}'" for i in _ids(3000)) + "]"
    db = {"database": serve.database}
    answers = [
        requests.get(url, params={**db, "query": sql.decode(), "param_ids": ids}, timeout=30),
        requests.post(url, params={**db, "param_ids": ids}, data=sql, timeout=30),
        requests.post(
            url,
            params={**db, "query": "SELECT count()"},
            data=b"FROM handoff_transitions",
            timeout=30,
        ),
    ]
    for coding, pack in (("gzip", gzip.compress), ("deflate", zlib.compress),
                         ("zstd", zstd.compress), ("lz4", lz4.frame.compress)):  # fmt: skip
        answers.append(
            requests.post(
                url,
                params={**db, "param_ids": ids},
                data=pack(sql),
                headers={"Content-Encoding": coding},
                timeout=30,
            )
        )
    body, ctype = encode_multipart_formdata({"query": sql.decode(), "param_ids": ids})
    answers.append(
        requests.post(url, params=db, data=body, headers={"Content-Type": ctype}, timeout=30)
    )
    answers.append(  # a multipart body compressed as a whole
        requests.post(
            url,
            params=db,
            data=gzip.compress(body),
            headers={"Content-Type": ctype, "Content-Encoding": "gzip"},
            timeout=30,
        )
    )
    assert [(r.status_code, r.text) for r in answers] == [(200, "9\n")] * len(answers)
    # a tab, a newline and a backslash reach the parser as sent (7 characters)
    r = requests.post(url, data=b"SELECT length('a\tb\\\\c\nd')", timeout=30)
    assert (r.status_code, r.text) == (200, "7\n")
    ext, ctype = encode_multipart_formdata({"query": "SELECT * FROM t", "t": ("t.csv", b"1")})
    r = requests.post(url, data=ext, headers={"Content-Type": ctype}, timeout=30)
    assert r.status_code == 400 and "external data" in r.text


# ------------------------------------------------------------------ the parser the port relies on


def _canonical(chdb_client, sql: str) -> str:
    return chdb_client.query(
        "SELECT formatQuerySingleLine({q:String})", parameters={"q": sql}
    ).result_rows[0][0]


def test_clickhouse_parser_refuses_several_statements_in_every_lexical_form(chdb_client):
    """What the port builds on: ClickHouse's own parser, handed the text as a bound value,
    refuses several statements however the `;` is hidden (it executes nothing), and gives
    one statement a canonical text that is its own canonical text (what is checked is what
    runs)."""
    from tests.unit.test_validate_sql import HIDDEN_SECOND_STATEMENTS

    for sql in HIDDEN_SECOND_STATEMENTS:
        with pytest.raises(DatabaseError, match=r"Multi-statements are not allowed|Syntax error"):
            _canonical(chdb_client, sql)
    for sql in (
        "SELECT $$a;b$$ # c ; d\n, 'it''s', `x``y` FROM t SETTINGS max_threads = 1 FORMAT JSON",
        "select 1 /* a /* b */ ; */ -- ;\n",
        "WITH 1 AS x SELECT x FROM {db:Identifier}.t WHERE y IN {ids:Array(String)}",
    ):
        once = _canonical(chdb_client, sql)
        assert ";" not in once.replace("'a;b'", "") and _canonical(chdb_client, once) == once


# ------------------------------------------------------------------ settings stay per request


def _max_threads(c) -> str:
    return c.query("SELECT value FROM system.settings WHERE name = 'max_threads'").result_rows[0][0]


def test_no_setting_outlives_its_request(serve):
    """A setting sent as a URL parameter or in a SETTINGS clause applies to that request
    only; a SET is refused; every later request (on every engine handle) sees the defaults."""
    c = serve.client()
    try:
        default = _max_threads(c)
        total = c.command("SELECT count() FROM handoff_transitions")
        hide = {"additional_table_filters": "{'handoff_transitions': 'handoff_id = \\'h-0\\''}"}
        assert c.query("SELECT count() FROM handoff_transitions", settings=hide).result_rows == [
            (3,)
        ]
        assert _max_threads(c) == default
        r = c.query(
            "SELECT count() FROM handoff_transitions SETTINGS additional_table_filters = "
            "{'handoff_transitions': 'handoff_id = \\'h-1\\''}, max_threads = 1"
        )
        assert r.result_rows == [(3,)]
        with pytest.raises(DatabaseError, match="READONLY"):
            c.command("SET max_threads = 1")
        for _ in range(6):  # more requests than there are engine slots
            assert _max_threads(c) == default
            assert c.command("SELECT count() FROM handoff_transitions") == total
    finally:
        c.close()


# ------------------------------------------------------------------ limits

LIMITED = {
    "HANDOFFS_QUERY_MAX_EXECUTION_S": "6",
    "HANDOFFS_QUERY_MAX_MEMORY_BYTES": str(256 * 1024 * 1024),
    "HANDOFFS_QUERY_MAX_RESULT_ROWS": "5000",  # clickhouse-connect reads ~1,900 at connect
    "HANDOFFS_QUERY_MAX_THREADS": "1",
    "HANDOFFS_QUERY_CONCURRENCY": "1",
}


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    h = start_serve(tmp_path_factory.mktemp("serve-limits"), env=LIMITED, query_port_open=True)
    yield h
    assert h.stop() == 0, h.log()


def _error_code(h, sql: str, **params) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = requests.post(h.query_url + "/", params=params, data=sql.encode(), timeout=60)
    return r.status_code, r.headers.get("X-ClickHouse-Exception-Code", ""), time.monotonic() - t0


def test_time_memory_rows_and_threads_are_bounded(limited):
    h = limited
    status, code, took = _error_code(
        h, "SELECT sleepEachRow(0.5) FROM numbers(20) SETTINGS max_block_size = 1"
    )
    assert (status, code) == (500, "159") and 5.5 < took < 12  # TIMEOUT_EXCEEDED at 6 s
    status, code, took = _error_code(
        h, "SELECT sleepEachRow(0.5) FROM numbers(20) SETTINGS max_block_size = 1",
        max_execution_time="1",
    )  # fmt: skip
    assert (status, code) == (500, "159") and took < 3  # a client may lower a limit
    assert _error_code(h, "SELECT length(groupArray(number)) FROM numbers(100000000)")[1] == "241"
    assert _error_code(h, "SELECT number FROM numbers(10000)")[1] == "396"
    assert _error_code(h, "SELECT count() FROM numbers(10000)")[:2] == (200, "")
    for sql, params in (
        ("SELECT 1 SETTINGS max_execution_time = 100", {}),
        ("SELECT * FROM (SELECT 1 SETTINGS max_memory_usage = 0)", {}),
        ("SELECT 1", {"max_threads": "4"}),
        ("SELECT 1", {"max_result_rows": "0"}),
    ):
        assert _error_code(h, sql, **params)[:2] == (403, "452"), (sql, params)
    c = h.client()
    try:
        settings = dict(
            c.query(
                "SELECT name, value FROM system.settings WHERE name IN ('max_threads', "
                "'max_execution_time', 'max_memory_usage', 'max_result_rows', 'readonly')"
            ).result_rows
        )
    finally:
        c.close()
    assert settings == {
        "max_threads": "1",
        "max_execution_time": "6",
        "max_memory_usage": str(256 * 1024 * 1024),
        "max_result_rows": "5000",
        "readonly": "2",
    }


def _raw_request(port: int, sql: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(sql), sql))
    return s


def test_busy_port_answers_503_and_an_abandoned_query_is_cancelled(limited):
    """With every slot busy a query is answered 503 + Retry-After within the queue wait,
    not queued for as long as the running one takes; closing the connection of a running
    query cancels it, so the slot frees at once (regression: two abandoned sleepEachRow
    queries held both handles for their full time and KILL QUERY is refused)."""
    h = limited
    slow = _raw_request(
        h.query_port, b"SELECT sleepEachRow(0.1) FROM numbers(1000) SETTINGS max_block_size = 1"
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # until the slow query holds the one slot
            r = requests.post(h.query_url + "/", data=b"SELECT 1", timeout=30)
            if r.status_code == 503 or time.monotonic() > deadline:
                break
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.headers["X-ClickHouse-Exception-Code"] == "202"
        assert "Too many simultaneous queries" in r.text
    finally:
        slow.close()
    closed = time.monotonic()
    while True:  # until the slot is free again
        r = requests.post(h.query_url + "/", data=b"SELECT 1", timeout=30)
        if r.status_code == 200 or time.monotonic() - closed > 30:
            break
    assert (r.status_code, r.text) == (200, "1\n")
    # freed well before the slow query's 6 s limit (it had ~4 s left when it was abandoned)
    assert time.monotonic() - closed < 2.0


# ------------------------------------------------------------------ request bodies


def _read_answer(s: socket.socket) -> bytes:
    """One HTTP answer off `s` (headers and a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += s.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_bad_content_length_is_refused_and_the_connection_closed(serve):
    """Content-Length: -1 is refused at once (regression: the port read to EOF, without a
    limit, and answered only when the client gave up)."""
    with socket.create_connection(("127.0.0.1", serve.query_port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nSELECT 1")
        answer = _read_answer(s)
        assert answer.startswith(b"HTTP/1.1 400") and b"Content-Length" in answer
        assert s.recv(1) == b""  # closed by the port


def test_a_body_sent_with_a_refused_or_bodiless_request_does_not_desync_keep_alive(serve):
    """A GET /ping or a refused query may carry a body: it is read (or drained) whole, so
    the next request on the connection is answered as itself (regression: the body of a
    GET was left unread and parsed as the next request line)."""
    with socket.create_connection(("127.0.0.1", serve.query_port), timeout=10) as s:
        for first in (
            b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSELECT 7",
            b"GET /?query=SELECT%205 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz",
            b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSELECT 8",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n\r\nDROP TABLE otel_x\n\n",
        ):
            s.sendall(first)
            assert _read_answer(s).split(b"\r\n", 1)[0] in (
                b"HTTP/1.1 200 OK",
                b"HTTP/1.1 404 Not Found",
                b"HTTP/1.1 403 Forbidden",
                b"HTTP/1.1 400 Bad Request",
            )
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSELECT 3")
            answer = _read_answer(s)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n3\n"), (
                first,
                answer,
            )


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
