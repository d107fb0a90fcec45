"""The read-only query port cannot be escaped: judged by the engine's side effects.

A real `handoffs serve` and canaries it must never touch: a secret file no answer may
contain (`file()`), a file no statement may write or append to (`INTO OUTFILE`), a local
listener no query may connect to (`url()`), and settings (`SET max_threads`,
`additional_table_filters`) a fresh request must still see at their defaults. The attacks
hide a second statement behind ClickHouse's lexical forms (heredocs, `#`/`//` comments,
nested comments) that a lexer not knowing them misreads, or use the reaching-out functions
in every letter case and inside view() and subqueries; each goes over GET, POST and
clickhouse-connect. `Canaries` is shared with test_query_port_fuzz.py.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from urllib3 import encode_multipart_formdata

from ingest.testing import request_protobuf, span_json, transition
from serve.testing import ServeHandle, start_serve

#: Lexical forms that hide the `;` before `{second}` from a lexer that does not know them:
#: the quote inside opens a string, for such a lexer, that swallows the `;`; the closing
#: `-- '` ends it.
HIDERS = (
    "SELECT $$'$$; {second} -- '",
    "SELECT $t$'$t$; {second} -- '",
    "SELECT 1 # it's\n; {second} -- '",
    "SELECT 1 #!'\n; {second} -- '",
    "SELECT 1 // '\n; {second} -- '",
    "SELECT 1 /* /* */ ' */ ; {second} -- '",
)


class _Listener:
    """A TCP listener on 127.0.0.1 that counts connections (and answers a tiny HTTP 200)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nleak\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@dataclass
class Canaries:
    """What no query may touch, and the statements that would touch it."""

    h: ServeHandle
    root: Path
    secret: str = field(default_factory=lambda: f"canary-{secrets.token_hex(8)}")
    listener: _Listener = field(default_factory=_Listener)

    def __post_init__(self) -> None:
        self.secret_file = self.root / "secret.txt"
        self.secret_file.write_text(self.secret + "\n")
        self.outfile = self.root / "outfile.txt"
        self.new_file = self.root / "must-not-exist.txt"
        self.reset()
        c = self.h.client()
        try:
            self.total = c.command("SELECT count() FROM handoff_transitions")
            self.max_threads = _setting(c, "max_threads")
        finally:
            c.close()

    def reset(self) -> None:
        """Put the file and listener canaries back (each test judges its own effects)."""
        self.outfile.write_text("untouched\n")
        self.new_file.unlink(missing_ok=True)
        self.listener.hits = 0

    def side_effects(self) -> dict[str, str]:
        """Second statements, by what they would do."""
        url = f"http://127.0.0.1:{self.listener.port}/leak"
        return {
            "read": f"SELECT * FROM file('{self.secret_file}', 'LineAsString')",
            "append": f"SELECT 'pwned' INTO OUTFILE '{self.outfile}' APPEND",
            "create": f"SELECT 'pwned' INTO OUTFILE '{self.new_file}'",
            "connect": f"SELECT * FROM url('{url}', 'LineAsString')",
            "set threads": "SET max_threads = 1",
            "set filter": "SET additional_table_filters = "
            "{'handoff_transitions': 'handoff_id = \\'nobody\\''}",
        }

    def send(self, sql: str, how: str) -> str:
        """Send `sql` one way; returns the answer's text (whatever its status)."""
        url = self.h.query_url + "/"
        if how == "get":
            r = requests.get(url, params={"query": sql}, auth=self.h.query_auth, timeout=30)
        elif how == "post":
            r = requests.post(url, data=sql.encode(), auth=self.h.query_auth, timeout=30)
        elif how == "form":
            body, ctype = encode_multipart_formdata({"query": sql, "param_x": "1"})
            r = requests.post(
                url, data=body, headers={"Content-Type": ctype}, auth=self.h.query_auth, timeout=30
            )
        else:
            c = self.h.client()
            try:
                return c.raw_query(sql).decode("utf-8", "replace")
            except Exception as exc:  # clickhouse-connect raises several types
                return str(exc)
            finally:
                c.close()
        return r.text

    def untouched(self) -> list[str]:
        """What was touched (empty: nothing), as seen from the files, the listener and fresh
        requests (more of them than the port has engine slots)."""
        touched = []
        if self.outfile.read_text() != "untouched\n":
            touched.append(f"outfile now {self.outfile.read_text()!r}")
        if self.new_file.exists():
            touched.append("a new file was written")
        if self.listener.hits:
            touched.append(f"{self.listener.hits} outbound connection(s)")
        for _ in range(4):
            c = self.h.client()
            try:
                if (n := c.command("SELECT count() FROM handoff_transitions")) != self.total:
                    touched.append(f"a reader sees {n} of {self.total} rows")
                if (v := _setting(c, "max_threads")) != self.max_threads:
                    touched.append(f"max_threads is {v}, was {self.max_threads}")
            finally:
                c.close()
        return touched


def _setting(c, name: str) -> str:
    return c.query(
        "SELECT value FROM system.settings WHERE name = {n:String}", parameters={"n": name}
    ).result_rows[0][0]


def seeded_serve(root: Path) -> ServeHandle:
    """A serve with 9 transitions of handoffs h-0..h-2 stored."""
    h = start_serve(root)
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
    assert r.status_code == 200, r.text
    h.wait_stored()
    return h


@pytest.fixture(scope="module")
def canaries(tmp_path_factory):
    root = tmp_path_factory.mktemp("qp-security")
    h = seeded_serve(root)
    k = Canaries(h, root)
    yield k
    k.listener.close()
    h.stop()


HOW = ("get", "post", "form", "client")


@pytest.mark.parametrize("effect", ["read", "append", "create", "connect", "set threads",
                                    "set filter"])  # fmt: skip
@pytest.mark.parametrize("hider", HIDERS)
def test_a_hidden_second_statement_never_runs(canaries, hider, effect):
    """Regression: the guard's own lexer missed these `;`, its EXPLAIN AST ran the second
    statement, and then the real run did again: file() returned the file, INTO OUTFILE
    APPEND appended (twice), url() connected out, and a SET stuck on the pooled engine
    handle so every later reader saw other settings (or no rows)."""
    canaries.reset()
    sql = hider.format(second=canaries.side_effects()[effect])
    answers = [canaries.send(sql, how) for how in HOW]
    leaked = [a[:200] for a in answers if canaries.secret in a]
    assert not leaked, leaked
    assert not canaries.untouched()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM file('{secret}', 'LineAsString')",
        "SELECT * FROM File('{secret}', 'LineAsString')",
        "SELECT * FROM FILE('{secret}', 'LineAsString')",
        "SELECT file('{secret}')",
        "SELECT * FROM view(SELECT * FROM file('{secret}', 'LineAsString'))",
        "SELECT (SELECT any(line) FROM file('{secret}', 'LineAsString'))",
        "SELECT * FROM url('{url}', 'LineAsString')",
        "SELECT * FROM URL('{url}', 'LineAsString')",
        "SELECT * FROM view(SELECT * FROM url('{url}', 'LineAsString'))",
        "WITH x AS (SELECT * FROM url('{url}', 'LineAsString')) SELECT * FROM x",
        "SELECT count() FROM numbers(3) WHERE toString(number) IN "
        "(SELECT line FROM url('{url}', 'LineAsString'))",
        "DESCRIBE TABLE url('{url}', 'LineAsString')",
        "EXPLAIN PIPELINE SELECT * FROM url('{url}', 'LineAsString')",
        "SELECT * FROM urlCluster('default', '{url}', 'LineAsString')",
        "SELECT * FROM remote('127.0.0.1:{port}', system.one)",
        "SELECT * FROM file('{secret}', 'LineAsString') SETTINGS max_threads = 1",
        "SELECT 1 INTO OUTFILE '{outfile}' APPEND",
        "SELECT 1 FORMAT TSV INTO OUTFILE '{outfile}' APPEND",
        "SELECT $$x$$ INTO OUTFILE '{outfile}' APPEND",
    ],
)
def test_functions_that_reach_out_are_refused_in_every_form(canaries, sql):
    canaries.reset()
    text = sql.format(
        secret=canaries.secret_file,
        url=f"http://127.0.0.1:{canaries.listener.port}/x",
        port=canaries.listener.port,
        outfile=canaries.outfile,
    )
    answers = [canaries.send(text, how) for how in HOW]
    assert not [a for a in answers if canaries.secret in a]
    assert not canaries.untouched()


@pytest.mark.parametrize("effect", ["set threads", "set filter"])
def test_a_setting_sent_any_way_is_gone_for_the_next_request(canaries, effect):
    """As a URL parameter, in a SETTINGS clause, or as SET (refused): never on a later
    request."""
    filt = "{'handoff_transitions': 'handoff_id = \\'nobody\\''}"
    url = canaries.h.query_url + "/"
    name, value = (
        ("max_threads", "1") if effect == "set threads" else ("additional_table_filters", filt)
    )
    auth = canaries.h.query_auth
    requests.post(
        url, params={name: value}, data=b"SELECT 1", auth=auth, timeout=30
    ).raise_for_status()
    requests.post(url, data=f"SELECT 1 SETTINGS {name} = {value}".encode(), auth=auth, timeout=30)
    refused = requests.post(url, data=f"SET {name} = {value}".encode(), auth=auth, timeout=30)
    assert refused.status_code == 403
    assert not canaries.untouched()
