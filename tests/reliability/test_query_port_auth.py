"""The query port's read tokens and tenant scope, judged by what a reader gets back.

A real `handoffs serve` with two tenants' spans (acme and globex, sent over OTLP with their
ingest tokens) and read tokens for acme and for an operator (`*`). Through clickhouse-connect
and raw HTTP: no credential or an unknown one is refused 401 (code 516) and logged without
the token; the three ways of sending one (basic auth, X-ClickHouse-Key, Bearer) work; an
acme reader never gets a globex row from any table, join, subquery, view() or system table,
nor by sending the filter setting itself; the operator sees both. A connection that stalls
in its request headers is closed. The credential decision and the filter are pure functions,
tested here with plain values too.
"""

from __future__ import annotations

import base64
import socket
import threading
import time

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError

from ingest.testing import request_protobuf, span_json, transition
from serve._query_policy import ReadAccess, Unauthorized, read_access, tenant_filters
from serve.testing import ServeHandle, start_serve, wait_until

TOKENS = {"ra": "acme", "rg": "globex", "op": "*"}
#: every table of the schema with a tenant column, and that column
TENANT_TABLES = {
    "otel_traces": "Tenant",
    "handoff_transitions": "tenant",
    "handoff_summary": "tenant",
    "handoff_tasks": "tenant",
    "handoff_anomaly_state": "tenant",
    "handoff_state_flags": "tenant",
    "anomaly_settle": "tenant",
    "handoff_settled": "tenant",
    "cohort_settle": "tenant",
    "handoff_relation_flags": "tenant",
    "relation_settle": "tenant",
    "handoff_audit_flags": "tenant",
    "audit_settle": "tenant",
    "transition_ledger": "tenant",
    "ingest_batches": "tenant",
    "ingest_rejects": "tenant",
    "handoff_transitions_mv": "tenant",
    "handoff_summary_mv": "tenant",
    "handoff_tasks_mv": "tenant",
    "handoff_anomaly_state_mv": "tenant",
    "blind_spots": "tenant",
}
#: tenant tables this module's spans leave empty (no multi-agent trace is sent): their scope
#: is the row policy test_tenant_scope.py checks on every table
EMPTY_HERE = frozenset({"blind_spots"})


def _basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# ------------------------------------------------------------------ pure decisions


@pytest.mark.parametrize(
    ("headers", "tenant"),
    [
        (_basic("default", "ra"), "acme"),
        (_basic("anyone", "op"), None),
        ({"x-clickhouse-user": "x", "x-clickhouse-key": "rg"}, "globex"),
        ({"authorization": "Bearer ra"}, "acme"),
        ({"authorization": "bearer   op "}, None),
    ],
)
def test_a_known_token_in_any_form_gives_its_tenant(headers, tenant):
    assert read_access(headers, TOKENS) == ReadAccess(tenant, authenticated=True)


@pytest.mark.parametrize(
    ("headers", "credential"),
    [
        ({}, ""),
        (_basic("default", ""), ""),
        ({"authorization": "Basic !!notbase64"}, ""),
        ({"authorization": "Bearer"}, ""),
        ({"x-clickhouse-user": "ra"}, ""),  # a user name is no token
        (_basic("ra", "nope"), "sha256:"),
        ({"x-clickhouse-key": "acme"}, "sha256:"),
    ],
)
def test_a_missing_or_unknown_token_is_refused_without_naming_it(headers, credential):
    with pytest.raises(Unauthorized) as exc:
        read_access(headers, TOKENS)
    assert exc.value.credential.startswith(credential)
    assert "nope" not in str(exc.value) + exc.value.credential
    if credential:
        assert len(exc.value.credential) == len("sha256:") + 8


def test_without_read_tokens_the_port_is_open_to_every_tenant():
    assert read_access({}, {}) == ReadAccess(None, authenticated=False)
    assert read_access(_basic("u", "whatever"), {}).tenant is None


def test_the_filter_scopes_tenant_tables_and_hides_the_rest():
    text = tenant_filters(
        [
            ("handoffs", "handoff_transitions", frozenset({"tenant", "claimed_tenant"})),
            ("handoffs", "otel_traces", frozenset({"Tenant"})),
            ("handoffs", "schema_version", frozenset({"file"})),
            ("system", "settings", frozenset()),
            ("system", "parts", frozenset()),
            ("INFORMATION_SCHEMA", "TABLES", frozenset()),
        ],
        "o'hara",
    )
    assert text == (
        "{'handoffs.handoff_transitions': '`tenant` = \\'o\\\\\\'hara\\'', "
        "'handoffs.otel_traces': '`Tenant` = \\'o\\\\\\'hara\\'', "
        "'handoffs.schema_version': '0', 'system.parts': '0', 'INFORMATION_SCHEMA.TABLES': '0'}"
    )


# ------------------------------------------------------------------ a real serve


def _spans(tenant: str, n: int, offset: int) -> bytes:
    spans = [
        span_json(
            trace_id=f"{offset + i + 1:032x}",
            span_id=f"{offset + i + 1:016x}",
            attributes=transition(
                f"{tenant}-h{i % 2}", "create", "", "created", task_id=f"{tenant}-t{i}"
            ),
            start_ns=time.time_ns() + i,
        )
        for i in range(n)
    ]
    # a task's transfer handed straight back (x1 after x0): a bounce in each tenant's
    # relation flags
    for j, (src, dst) in enumerate((("agent-a", "agent-b"), ("agent-b", "agent-a"))):
        spans.append(
            span_json(
                trace_id=f"{offset + 900 + j:032x}",
                span_id=f"{offset + 900 + j:016x}",
                attributes=transition(
                    f"{tenant}-x{j}",
                    "create",
                    "",
                    "created",
                    task_id=f"{tenant}-tb",
                    handoff__mode="transfer",
                    handoff__from_agent=src,
                    handoff__to_agent=dst,
                ),
                start_ns=time.time_ns() + n + j,
            )
        )
    # a message asking for an ack that never came: a row in each tenant's audit flags
    spans.append(
        span_json(
            trace_id=f"{offset + 950:032x}",
            span_id=f"{offset + 950:016x}",
            attributes=transition(
                f"{tenant}-ack",
                "create",
                "",
                "created",
                task_id=f"{tenant}-ta",
                handoff__message__requires_ack=True,
                handoff__message__ttl_s=60,
            ),
            start_ns=time.time_ns() + n + 5,
        )
    )
    # one span each tenant's validation refuses, so ingest_rejects holds both tenants
    spans.append(
        span_json(
            trace_id=f"{offset + 999:032x}",
            span_id="abcd",  # two bytes: not a span id
            attributes=transition(f"{tenant}-bad", "create", "", "created"),
            start_ns=time.time_ns(),
        )
    )
    return request_protobuf(spans)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(
        tmp_path_factory.mktemp("qp-auth"),
        "ia=acme,ig=globex",
        query_tokens=",".join(f"{k}={v}" for k, v in TOKENS.items()),
        env={"HANDOFFS_SETTLE_EVERY_S": "0.2", "HANDOFFS_SETTLE_LAG_S": "0"},
    )
    for token, tenant, n, offset in (("ia", "acme", 4, 0), ("ig", "globex", 6, 1000)):
        r = requests.post(
            f"{h.otlp_url}/v1/traces",
            data=_spans(tenant, n, offset),
            headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    h.wait_stored()
    # the settle thread has settled both tenants' flags (each tenant's two handoffs were
    # created more than once: duplicate delivery) and cohort rows, and nothing is left
    # for it to write
    op = _client(h, "op")
    settled = "SELECT uniqExact(tenant) FROM {t}"
    behind = (
        "SELECT count() FROM handoff_anomaly_state"
        " WHERE touched >= (SELECT max(watermark) FROM anomaly_settle)"
    )
    wait_until(
        lambda: (
            all(
                op.command(settled.format(t=t)) == 2
                for t in (
                    "anomaly_settle",
                    "handoff_state_flags",
                    "cohort_settle",
                    "handoff_settled",
                    "handoff_relation_flags",
                    "relation_settle",
                    "handoff_audit_flags",
                    "audit_settle",
                )
            )
            and op.command(behind) == 0
        ),
        30,
        "both tenants' anomaly flags settled",
    )
    op.close()
    yield h
    assert h.stop() == 0, h.log()


def _client(h: ServeHandle, token: str):
    return clickhouse_connect.get_client(
        host="127.0.0.1", port=h.query_port, database=h.database, password=token
    )


@pytest.fixture(scope="module")
def acme(serve):
    c = _client(serve, "ra")
    yield c
    c.close()


@pytest.fixture(scope="module")
def operator(serve):
    c = _client(serve, "op")
    yield c
    c.close()


def test_the_start_up_line_and_health_say_query_auth_is_on(serve):
    assert "query auth on" in serve.log()
    assert serve.health()["query_auth"] == "on"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Basic " + base64.b64encode(b"default:wrong-secret").decode()}],
)
def test_no_or_a_wrong_token_is_answered_401_code_516_and_logged_without_it(serve, headers):
    r = requests.post(serve.query_url + "/", data=b"SELECT 1", headers=headers, timeout=30)
    assert r.status_code == 401
    assert r.headers["X-ClickHouse-Exception-Code"] == "516"
    assert r.text.startswith("Code: 516. DB::Exception: ")
    assert "(AUTHENTICATION_FAILED)" in r.text
    assert "wrong-secret" not in serve.log()
    assert "query port: refused" in serve.log()


def test_clickhouse_connect_without_the_token_fails_to_connect_with_516(serve):
    with pytest.raises(DatabaseError) as exc:
        clickhouse_connect.get_client(host="127.0.0.1", port=serve.query_port, password="nope")
    assert "516" in str(exc.value)


def test_ping_stays_open(serve):
    assert requests.get(serve.query_url + "/ping", timeout=30).text == "Ok.\n"


@pytest.mark.parametrize(
    "headers",
    [
        {"X-ClickHouse-User": "reader", "X-ClickHouse-Key": "ra"},
        {"Authorization": "Bearer ra"},
        {"Authorization": "Basic " + base64.b64encode(b"reader:ra").decode()},
    ],
)
def test_every_credential_form_reads_as_its_tenant(serve, headers):
    r = requests.post(
        serve.query_url + "/",
        params={"database": serve.database},
        data=b"SELECT DISTINCT tenant FROM handoff_transitions",
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.text == "acme\n"


@pytest.mark.parametrize(
    ("table", "column"), sorted((t, c) for t, c in TENANT_TABLES.items() if t not in EMPTY_HERE)
)
def test_an_acme_reader_sees_only_acme_rows_of_every_table(acme, operator, table, column):
    seen = {r[0] for r in acme.query(f"SELECT DISTINCT `{column}` FROM {table}").result_rows}
    everyone = {
        r[0] for r in operator.query(f"SELECT DISTINCT `{column}` FROM {table}").result_rows
    }
    assert seen == {"acme"}, (table, seen)
    assert everyone == {"acme", "globex"}, (table, everyone)
    n = acme.command(f"SELECT count() FROM {table}")
    assert n == acme.command(f"SELECT countIf(`{column}` = 'acme') FROM handoffs.{table}")
    assert n < operator.command(f"SELECT count() FROM {table}")


def test_every_tenant_table_of_the_schema_is_covered(operator):
    have = {
        t
        for (t,) in operator.query(
            "SELECT table FROM system.columns WHERE database = 'handoffs' "
            "AND name IN ('tenant', 'Tenant')"
        ).result_rows
    }
    assert have == set(TENANT_TABLES)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT tenant FROM handoff_transitions",
        "SELECT tenant FROM handoffs.handoff_transitions AS handoff_summary",
        "SELECT b.tenant FROM handoff_summary AS a FULL OUTER JOIN handoff_transitions AS b "
        "ON a.handoff_id = b.handoff_id",
        "SELECT a.tenant FROM handoff_transitions AS a CROSS JOIN transition_ledger AS b",
        "SELECT tenant FROM (SELECT * FROM handoff_transitions) WHERE 1",
        "SELECT * FROM view(SELECT tenant FROM handoff_tasks)",
        "WITH x AS (SELECT tenant FROM transition_ledger) SELECT * FROM x",
        "SELECT Tenant FROM otel_traces UNION ALL SELECT tenant FROM ingest_batches",
        "SELECT arrayJoin(groupArray(tenant)) FROM ingest_rejects",
        "SELECT (SELECT groupUniqArray(tenant) FROM handoff_summary)",
        "SELECT 'globex' WHERE 'globex' IN (SELECT tenant FROM handoff_transitions)",
        "SELECT tenant FROM handoff_transitions WHERE tenant = 'globex' OR 1",
        "SELECT if(('globex', 'globex-t0', 'globex-h0') IN handoff_tasks, 'glob' || 'ex', 'no')",
        "SELECT if(('globex', 'globex-t0', 'globex-h0') GLOBAL IN handoff_tasks, "
        "'glob' || 'ex', 'no')",
        "SELECT count() FROM handoff_transitions "
        "SETTINGS max_rows_to_read = 1, read_overflow_mode = 'throw'",
        "SELECT tenant FROM handoff_transitions SETTINGS additional_table_filters = {}",
        "SELECT tenant FROM handoff_transitions SETTINGS additional_table_filters = "
        "{'handoffs.handoff_transitions': '1'}",
        "SELECT * FROM view(SELECT tenant FROM handoff_transitions "
        "SETTINGS additional_table_filters = {})",
        "SELECT tenant FROM merge('handoffs', '^handoff_')",
        "SELECT tenant FROM cluster('default', handoffs.handoff_transitions)",
        "SELECT concat(database, table, toString(rows)) FROM system.parts",
        "SELECT concat(name, toString(total_rows)) FROM system.tables",
        "SELECT concat(table, toString(rows)) FROM system.parts_columns",
        "SELECT query FROM system.processes",
        "SELECT query FROM system.query_log",
        "SELECT concat(table_name, toString(table_rows)) FROM information_schema.tables",
        "SELECT * FROM system.columns",
        "SHOW TABLES",
        "EXPLAIN ESTIMATE SELECT * FROM handoff_transitions",
        "EXPLAIN indexes = 1 SELECT * FROM handoff_transitions WHERE tenant != ''",
    ],
)
def test_no_query_shape_gives_an_acme_reader_globex_data(serve, acme, sql):
    """Answered or refused, never with another tenant's name or rows in it."""
    try:
        text = acme.raw_query(sql, fmt="TabSeparated").decode("utf-8", "replace")
    except DatabaseError as exc:
        assert "globex" not in str(exc), str(exc)[:500]
        return
    assert "globex" not in text, text[:500]
    # no count of all tenants' rows (globex alone stored 8 transitions) shows either
    numbers = [int(w) for w in text.replace("\t", " ").split() if w.isdigit()]
    assert all(n < 8 for n in numbers), text[:500]


def test_the_filter_setting_is_refused_from_a_tenant_and_allowed_to_the_operator(
    serve, acme, operator
):
    sql = "SELECT count() FROM handoff_transitions"
    for settings in ({"additional_table_filters": "{}"},):
        with pytest.raises(DatabaseError, match="SETTING_CONSTRAINT_VIOLATION"):
            acme.query(sql, settings=settings)
        assert operator.query(sql, settings=settings).result_rows == [(16,)]
    with pytest.raises(DatabaseError, match="SETTING_CONSTRAINT_VIOLATION"):
        acme.query(sql + " SETTINGS additional_table_filters = {}")


def test_an_acme_reader_still_does_what_a_client_does(acme):
    assert acme.query("SELECT count() FROM handoff_transitions").result_rows == [(7,)]
    assert acme.command("EXISTS TABLE handoffs.handoff_transitions") == 1
    assert acme.query("DESCRIBE TABLE otel_traces").result_rows
    assert acme.query("EXPLAIN SELECT count() FROM handoff_transitions").result_rows
    df = acme.query_df("SELECT handoff_id, tenant FROM handoff_transitions ORDER BY handoff_id")
    assert set(df["tenant"]) == {"acme"} and len(df) == 7


def test_the_operator_reads_every_tenant(operator):
    rows = operator.query(
        "SELECT tenant, count() FROM handoff_transitions GROUP BY tenant ORDER BY tenant"
    ).result_rows
    assert rows == [("acme", 7), ("globex", 9)]
    assert operator.command("SELECT count() FROM system.parts WHERE database = 'handoffs'") > 0


# ------------------------------------------------------------------ stalled connections


#: the header timeout the open serve is given (HANDOFFS_QUERY_HEADER_TIMEOUT_S), short so that
#: the tests that wait it out stay short
HEADER_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def open_serve(tmp_path_factory):
    h = start_serve(
        tmp_path_factory.mktemp("qp-open"),
        query_port_open=True,
        env={"HANDOFFS_QUERY_HEADER_TIMEOUT_S": f"{HEADER_TIMEOUT_S:g}"},
    )
    yield h
    assert h.stop() == 0, h.log()


def test_without_read_tokens_serve_says_so_at_start(open_serve):
    log = open_serve.log()
    assert "query auth off" in log
    assert "no read tokens" in log
    assert open_serve.health()["query_auth"] == "off"


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed `sock` (EOF or reset); fails past `seconds`."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection is still open after {seconds:g} s")
    return time.monotonic() - t0


def test_a_connection_stalling_in_its_request_is_closed(open_serve):
    """Regression: a request line or headers never finished kept the connection (and its
    thread) open for good. Nothing sent, half a request line, half the headers, and headers
    trickled a byte a second (each read well within a socket timeout): all at once."""
    partials = (
        b"",
        b"POST / HTT",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le",
        b"GET / HTTP/1.1\r\n",
    )
    socks = [
        socket.create_connection(("127.0.0.1", open_serve.query_port), timeout=5) for _ in partials
    ]
    stop = threading.Event()

    def trickle(sock: socket.socket) -> None:
        while not stop.wait(1.0):
            try:
                sock.sendall(b"x")
            except OSError:
                return

    try:
        for s, partial in zip(socks, partials, strict=True):
            s.sendall(partial)
        threading.Thread(target=trickle, args=(socks[-1],), daemon=True).start()
        # within a few seconds of the setting: serve honours it (its default is 15 s)
        took = [_closed_within(s, HEADER_TIMEOUT_S + 6) for s in socks]
    finally:
        stop.set()
        for s in socks:
            s.close()
    assert took[0] >= HEADER_TIMEOUT_S - 1


def test_a_query_longer_than_the_header_timeout_still_answers(open_serve):
    """The header timeout bounds reading a request, not running its query."""
    seconds = int(HEADER_TIMEOUT_S) + 2
    c = open_serve.client()
    try:
        t0 = time.monotonic()
        n = c.command(
            f"SELECT count() FROM numbers({seconds}) WHERE NOT ignore(sleepEachRow(1)) "
            "SETTINGS max_block_size = 1"
        )
        assert n == seconds
        assert time.monotonic() - t0 >= HEADER_TIMEOUT_S
    finally:
        c.close()


# ------------------------------------------------------------------ the dashboard and the CLI


def test_the_dashboard_sends_the_token_from_the_url_or_the_environment(serve, monkeypatch):
    from dashboard._store import StoreUnavailable, open_client, resolve_target

    where = f"127.0.0.1:{serve.query_port}"
    monkeypatch.delenv("HANDOFFS_PASSWORD", raising=False)
    with pytest.raises(StoreUnavailable, match="HANDOFFS_PASSWORD"):
        open_client(resolve_target(f"http://{where}"))
    c = open_client(resolve_target(f"http://reader:ra@{where}"))
    assert c.query("SELECT DISTINCT tenant FROM handoffs.handoff_transitions").result_rows == [
        ("acme",)
    ]
    c.close()
    monkeypatch.setenv("HANDOFFS_PASSWORD", "op")
    c = open_client(resolve_target(f"http://{where}"))
    assert c.command("SELECT uniqExact(tenant) FROM handoffs.handoff_transitions") == 2
    c.close()


def test_a_percent_encoded_token_in_the_store_url_is_sent_decoded():
    from foundation.store import parse_store

    assert parse_store("http://reader:a%3Ab%40c@127.0.0.1:8124").password == "a:b@c"


def test_the_dashboard_command_does_not_print_the_token():
    from dashboard._cli import _without_password

    assert _without_password("http://reader:s3cret@127.0.0.1:8124") == (
        "http://reader:***@127.0.0.1:8124"
    )
    assert _without_password("http://127.0.0.1:8124") == "http://127.0.0.1:8124"


def test_the_cli_reads_as_the_token_it_is_given(serve):
    """`handoffs metrics --by tenant` over the port: the acme token's answer names acme only,
    the operator's both tenants (the token given as HANDOFFS_PASSWORD)."""
    import os
    import subprocess
    import sys

    def metrics(token: str) -> str:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "handoffs",
                "metrics",
                "--store",
                serve.query_url,
                "--by",
                "tenant",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HANDOFFS_PASSWORD": token},
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    acme, everyone = metrics("ra"), metrics("op")
    assert "acme" in acme and "globex" not in acme
    assert "acme" in everyone and "globex" in everyone
