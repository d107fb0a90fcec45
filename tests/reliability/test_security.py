"""No one in where they don't belong: auth, tenant binding, a read-only query port on loopback,
parameterized analytics queries, a read-only dashboard path.

Everything runs against one real `handoffs serve` (module_serve, two tenants' tokens) over
real HTTP; the query-port attacks go both raw (requests) and through clickhouse-connect.
"""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import pytest
import requests

from ingest.testing import request_json, request_protobuf, span_json, transition
from tests.reliability._helpers import ACME, GLOBEX, JS, PB, handoff_request, post

ROOT = Path(__file__).resolve().parents[2]
INJECTIONS = (
    "' OR 1=1 --",
    "x' OR '1'='1",
    "'; DROP TABLE handoff_transitions; --",
    '" OR ""="',
    "\\' OR 1=1 --",
    "\\",
    "h-1\\",
    "%' OR handoff_id LIKE '%",
    "h-1' UNION ALL SELECT * FROM system.users --",
    "{q:String}",
    "ünïcødé-🦊-\u202e-\u0000",
    "h-1\n OR 1=1",
    "`; SELECT 1",
    "h-",
)


def _count(h, sql: str) -> int:
    c = h.client()
    try:
        return int(c.query(sql).result_rows[0][0])
    finally:
        c.close()


def _seed(h, tenant_headers: dict, ids: list[str], *, claim: str | None = None) -> None:
    """Create handoffs `ids` (one create + accept each) for the token's tenant; wait stored."""
    now = time.time_ns()
    spans = []
    for n, hid in enumerate(ids):
        for k, ev in enumerate((("create", "", "created"), ("accept", "created", "accepted"))):
            extra = {"handoff__tenant": claim} if claim else {}
            spans.append(
                span_json(
                    trace_id=f"{random.Random(hid).getrandbits(127) | 1:032x}",
                    span_id=f"{random.Random(f'{hid}{k}').getrandbits(63) | 1:016x}",
                    attributes=transition(hid, *ev, task_id=f"task-{hid}", **extra),
                    start_ns=now + 2 * n + k,
                )
            )
    r = post(h.otlp_url, request_protobuf(spans), {**PB, **tenant_headers})
    assert r.status_code == 200, r.text
    h.wait_stored(60)


@pytest.fixture(scope="module")
def seeded(module_serve):
    h = module_serve
    _seed(h, ACME, ["h-1", "h-2", "h-3", *INJECTIONS[:3]])
    _seed(h, GLOBEX, ["g-1", "g-2"])
    return h


# ------------------------------------------------------------------ auth


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Bearer tok-acm"},  # a prefix of a real token
        {"Authorization": "Bearer tok-acme-x"},
        {"Authorization": "Basic dG9rLWFjbWU6"},
        {"Authorization": "tok-acme"},
        {"Authorization": "Bearer acme"},  # a tenant name is not a token
        {"Authorization": "Bearer tok-acme=acme"},
    ],
    ids=lambda d: repr(d.get("Authorization", "(none)")),
)
def test_without_a_valid_token_nothing_is_written(module_serve, headers):
    h = module_serve
    before = h.health()
    sent = handoff_request(random.Random(7100), 3, prefix="unauth")
    for body, ctype in ((sent.body, PB), (b"{}", JS)):
        r = post(h.otlp_url, body, {**ctype, **headers})
        assert r.status_code == 401, r.text
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "token" in (r.text if ctype is JS else r.content.decode("latin-1"))
    after = h.health()
    assert after["requests"] == before["requests"] and after["spans"] == before["spans"]
    assert _count(h, "SELECT count() FROM otel_traces WHERE SpanName LIKE 'unauth%' "
                  "OR SpanAttributes['handoff.handoff_id'] LIKE 'unauth-%'") == 0  # fmt: skip


def test_span_claiming_another_tenant_lands_in_the_credentials_tenant_flagged(module_serve):
    h = module_serve
    body = request_json(
        [
            span_json(
                trace_id="c1" * 16,
                span_id="c1" * 8,
                attributes=transition("claim-1", "create", "", "created", handoff__tenant="globex"),
                start_ns=time.time_ns(),
            )
        ]
    )
    # A resource-level claim too: the column default a stock collector would use.
    body["resourceSpans"][0]["resource"]["attributes"].append(
        {"key": "handoffs.tenant", "value": {"stringValue": "globex"}}
    )
    r = post(h.otlp_url, json.dumps(body).encode(), {**JS, **ACME})
    assert r.status_code == 200
    h.wait_stored(60)
    c = h.client()
    try:
        rows = c.query(
            "SELECT tenant, claimed_tenant FROM handoff_transitions WHERE handoff_id = 'claim-1'"
        ).result_rows
        raw = c.query(
            "SELECT Tenant, SpanAttributes['handoff.tenant_mismatch'] FROM otel_traces "
            "WHERE SpanId = {s:String}",
            parameters={"s": "c1" * 8},
        ).result_rows
    finally:
        c.close()
    assert rows == [("acme", "globex")]
    assert raw == [("acme", "true")]


# ------------------------------------------------------------------ query port

WRITES = (
    "INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')",
    "insert into otel_traces (SpanId) values ('0000000000000bad')",
    "  /* comment */ INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')",
    "-- c\nINSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')",
    "ALTER TABLE otel_traces DELETE WHERE 1",
    "ALTER TABLE otel_traces ADD COLUMN pwned String",
    "DROP TABLE handoff_transitions",
    "DROP DATABASE handoffs",
    "TRUNCATE TABLE otel_traces",
    "CREATE TABLE pwned (x UInt8) ENGINE = Memory",
    "CREATE DATABASE pwned",
    "RENAME TABLE otel_traces TO pwned",
    "OPTIMIZE TABLE otel_traces FINAL",
    "SYSTEM DROP MARK CACHE",
    "SYSTEM SHUTDOWN",
    "KILL QUERY WHERE 1",
    "GRANT ALL ON *.* TO default",
    "SET readonly = 0",
    "SET readonly = 0; INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')",
    "(INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad'))",
    "INSERT INTO FUNCTION file('/tmp/handoffs-pwned-file.csv', 'CSV') SELECT 1",
    "INSERT INTO FUNCTION url('http://127.0.0.1:9/x', 'CSV', 'x String') SELECT 'leak'",
    "DETACH TABLE otel_traces",
    "ATTACH TABLE otel_traces",
    "BACKUP TABLE otel_traces TO File('/tmp/handoffs-pwned-backup')",
    "SELECT 1 FROM system.one SETTINGS readonly = 0",
)
#: Statements that start with SELECT/WITH/EXPLAIN (so pass serve's keyword check) and then
#: write, escape the store or desynchronize the engine handle.
MULTI = (
    "SELECT 1; DROP TABLE handoff_transitions",
    "SELECT 1; INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')",
    "WITH 1 AS x SELECT x; DROP TABLE handoff_transitions",
    "EXPLAIN SELECT 1; DROP TABLE handoff_transitions",
)
ESCAPES = (
    "SELECT * FROM otel_traces INTO OUTFILE '/tmp/handoffs-pwned-outfile.csv'",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM remote('127.0.0.1', system.one)",
)


def _schema_fingerprint(h) -> tuple:
    c = h.client()
    try:
        return (
            c.query("SELECT name FROM system.databases ORDER BY name").result_rows,
            c.query(
                "SELECT database, name, metadata_modification_time FROM system.tables "
                "WHERE database NOT IN ('system', 'INFORMATION_SCHEMA', 'information_schema') "
                "ORDER BY database, name"
            ).result_rows,
            c.query("SELECT count() FROM otel_traces").result_rows,
            c.query("SELECT count() FROM handoff_transitions").result_rows,
        )
    finally:
        c.close()


def _refused(h, sql: str) -> list[tuple[str, int, str]]:
    """POST and GET `sql` raw; the (transport, status, body) of each answer that was a 200."""
    leaks = []
    for how, kw in (("get", {"params": {"query": sql}}), ("post", {"data": sql.encode()})):
        r = getattr(requests, how)(h.query_url + "/", timeout=30, auth=h.query_auth, **kw)
        if r.status_code == 200:
            leaks.append((how, r.status_code, r.text[:200]))
        else:
            assert r.headers.get("X-ClickHouse-Exception-Code"), (sql, r.text)
            assert r.text.startswith("Code: "), r.text  # ClickHouse's error shape, no traceback
    return leaks


def test_query_port_refuses_every_write_and_ddl(seeded):
    h = seeded
    before = _schema_fingerprint(h)
    leaks = {sql: leak for sql in WRITES if (leak := _refused(h, sql))}
    c = h.client()
    try:
        for sql in WRITES:  # and through clickhouse-connect, as the dashboard would
            with pytest.raises(Exception):  # noqa: B017 (clickhouse-connect raises several types)
                c.command(sql)
    finally:
        c.close()
    assert not leaks, leaks
    assert _schema_fingerprint(h) == before
    assert not list(Path("/tmp").glob("handoffs-pwned*"))
    print(f"FIGURES query_port: statements={len(WRITES)} refused={len(WRITES)} (x2 transports)")


def test_multi_statement_is_refused_and_leaves_the_query_port_working(start_serve, tmp_path):
    """'SELECT 1; DROP ...' is refused up front and every pool handle still answers
    (regression: the engine refused the DROP but left the chDB handle desynchronized)."""
    h = start_serve(tmp_path)
    try:
        for sql in MULTI:
            assert not _refused(h, sql), sql
        for _ in range(4):  # every pool handle
            c = h.client(connect_timeout=5, send_receive_timeout=10)
            try:
                assert c.query("SELECT 42").result_rows == [(42,)]
            finally:
                c.close()
        assert _count(h, "SELECT count() FROM system.tables WHERE name = 'handoff_transitions'")
    finally:
        h.kill()


def test_query_port_cannot_touch_files_or_the_network(start_serve, tmp_path):
    """INTO OUTFILE, file() and remote() are refused by the read-only port: no file written
    or read on serve's host, no outbound connection (regression: readonly=2 alone let them)."""
    h = start_serve(tmp_path)
    out = Path("/tmp/handoffs-pwned-outfile.csv")
    out.unlink(missing_ok=True)
    try:
        leaks = {sql: leak for sql in ESCAPES if (leak := _refused(h, sql))}
        created = out.exists()
    finally:
        out.unlink(missing_ok=True)
        h.kill()
    print(f"FIGURES query_escapes: answered_200={sorted(leaks)} outfile_created={created}")
    assert not leaks and not created, (leaks, created)


def test_read_only_cannot_be_lifted_by_url_settings(seeded):
    h = seeded
    sql = "INSERT INTO otel_traces (SpanId) VALUES ('0000000000000bad')"
    for params in (
        {"readonly": "0"},
        {"readonly": "1"},
        {"allow_ddl": "1"},
        {"profile": "default"},
        {"user": "default", "password": ""},
        {"max_execution_time": "1'; DROP TABLE otel_traces; --"},
    ):
        r = requests.post(
            h.query_url + "/", params=params, data=sql.encode(), auth=h.query_auth, timeout=30
        )
        assert r.status_code != 200, (params, r.text)
    # A setting name is never spliced into SQL: a malicious name is refused up front.
    r = requests.get(
        h.query_url + "/", params={"query": "SELECT 1", "x = 1; DROP TABLE otel_traces; --": "1"},
        auth=h.query_auth, timeout=30,
    )  # fmt: skip
    assert r.status_code == 400 and "Unknown setting" in r.text
    assert _count(h, "SELECT count() FROM otel_traces WHERE SpanId = '0000000000000bad'") == 0


def _non_loopback_ip() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outbound interface
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_ports_bind_loopback_by_default(module_serve):
    h = module_serve
    log = h.log()
    assert f"ClickHouse HTTP (read-only) http://127.0.0.1:{h.query_port}" in log
    assert f"OTLP http://127.0.0.1:{h.otlp_port}/v1/traces" in log
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("no non-loopback interface to probe from")
    for port in (h.query_port, h.otlp_port):
        with pytest.raises(OSError), socket.create_connection((ip, port), timeout=5):
            pass


# ------------------------------------------------------------------ analytics parameters


def _window():
    from datetime import UTC, datetime, timedelta

    from analytics import Window

    now = datetime.now(UTC)
    return Window(start=now - timedelta(days=1), end=now + timedelta(hours=1), as_of=now)


@pytest.mark.parametrize("inj", INJECTIONS)
def test_analytics_inputs_are_bound_parameters(seeded, inj):
    from analytics import evidence_package, find_handoffs, handoffs_behind

    h = seeded
    c = h.client()
    try:
        found = find_handoffs(c, database=h.database, query=inj)
        ids = set(found["handoff_id"])
        # Only handoffs whose id/task/key equals the string (or ids it prefixes) match.
        assert all(i == inj or i.startswith(inj.strip()) for i in ids), ids
        if inj in INJECTIONS[:3]:
            assert ids == {inj}  # stored under that very id by `seeded`: found, alone
        win = _window()
        for dim in ("from_agent", "to_agent", "mode", "tenant", "capability"):
            df = handoffs_behind(c, database=h.database, window=win, filters={dim: inj})
            assert df.empty, (dim, df)
        assert handoffs_behind(c, database=h.database, window=win, tenant=inj).empty
        pkg = evidence_package(c, database=h.database, handoff_id=inj, tenant="acme")
        if inj in INJECTIONS[:3]:
            assert pkg is not None and pkg["handoff_id"] == inj
        else:
            assert pkg is None
        assert evidence_package(c, database=h.database, handoff_id=inj, tenant=inj) is None
    finally:
        c.close()
    # Tenants stay apart: globex's handoffs never appear in acme's results.
    assert _count(h, "SELECT count() FROM handoff_transitions WHERE tenant = 'globex'") == 4


def test_analytics_database_name_is_validated(seeded):
    from analytics import find_handoffs

    c = seeded.client()
    try:
        for bad in ("handoffs; DROP TABLE x", "handoffs.otel_traces --", "a b", "`x`"):
            with pytest.raises(ValueError, match="database"):
                find_handoffs(c, database=bad, query="h-1")
    finally:
        c.close()


# ------------------------------------------------------------------ dashboard


def test_dashboard_read_path_is_read_only(seeded):
    from dashboard._store import open_client, resolve_target

    h = seeded
    client = open_client(resolve_target(h.query_url, h.database))
    try:
        for sql in WRITES[:10]:  # the dashboard's own client
            with pytest.raises(Exception):  # noqa: B017
                client.command(sql)
        with pytest.raises(Exception):  # noqa: B017
            client.insert("otel_traces", [["0000000000000bad"]], column_names=["SpanId"])
    finally:
        client.close()
    assert _count(h, "SELECT count() FROM otel_traces WHERE SpanId = '0000000000000bad'") == 0
    # And the dashboard's code issues no writes of its own.
    src = "\n".join(p.read_text() for p in (ROOT / "dashboard").rglob("*.py"))
    for needle in (".command(", "client.insert(", "INSERT ", "ALTER ", "DROP ", "CREATE "):
        assert needle not in src, needle
