"""Shared fixtures.

chDB lets one process open only ONE data path in its lifetime, so the whole test session
shares one embedded path and each test gets its own database (`fresh_db`). Tests that need a
second path run chDB in a subprocess (e.g. `handoffs serve`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.store import StoreSpec, apply_schema, connect, parse_store


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb-session")


@pytest.fixture(scope="session")
def chdb_client(chdb_path: Path):
    """One clickhouse-connect chDB client on the session-wide path (no default database)."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    client = connect(spec, database="")
    yield client
    client.close()


@pytest.fixture
def fresh_db(chdb_client) -> Iterator[str]:
    """A new database with the full schema applied; returns its name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    apply_schema(chdb_client, name)
    yield name
    if not os.environ.get("HANDOFFS_KEEP_TEST_DBS"):
        chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


@pytest.fixture(scope="session")
def query_port(chdb_path: Path):
    """serve's read-only query port over the session store, in this process (the engine is
    the one this process already has open): the port number."""
    import threading

    from serve._query_engine import QueryEngine
    from serve._query_http import make_query_server

    engine = QueryEngine(str(chdb_path))
    server = make_query_server("127.0.0.1", 0, engine, database="default")
    thread = threading.Thread(target=server.serve_forever, name="test-query-port", daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    engine.close()


@pytest.fixture(scope="session", params=["embedded", "http"])
def reader(request, chdb_client):
    """The client the analytics read through, once per store kind: the embedded engine
    itself, and clickhouse-connect over HTTP to serve's query port on the same store (what
    the dashboard and the CLI use against a running serve). Tests write with chdb_client."""
    if request.param == "embedded":
        yield chdb_client
        return
    port = request.getfixturevalue("query_port")
    # opened as the CLI and the dashboard open theirs (foundation.store.connect), so that
    # anomalies() runs its passes on it and its sibling at once, as they do
    client = connect(parse_store(f"http://127.0.0.1:{port}"), database="default")
    yield client
    client.close()


# --- `handoffs serve` as a subprocess (provided by serve/; see serve/testing.py) -----------
# start_serve(tmp_path, tokens=None) -> ServeHandle(otlp_url, query_url, store_dir, database,
# process, stop(), kill(), client(), wait_stored(), health()). The query URL speaks
# ClickHouse HTTP (read-only): ServeHandle.client() opens a client with its read token.


@pytest.fixture
def start_serve(tmp_path: Path):
    """Factory: start_serve([tmp_path], tokens=None, **kw) -> ServeHandle; all stopped after.

    Keyword options (serve.testing.start_serve): store_dir=, database=, otlp_port=,
    query_port=, grpc_port=, query_tokens=, query_port_open=, extra_args=(...), env={...}.
    Reusing store_dir restarts on the same store.
    """
    from serve.testing import start_serve as _start

    handles = []

    def factory(path: Path | None = None, tokens: str | None = None, **kwargs):
        h = _start(path or tmp_path, tokens, **kwargs)
        handles.append(h)
        return h

    yield factory
    for h in handles:
        h.stop()


@pytest.fixture
def serve_process(start_serve):
    """A running `handoffs serve` on a fresh embedded store (no auth); stopped afterwards."""
    return start_serve()
