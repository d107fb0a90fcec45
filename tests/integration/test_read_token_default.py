"""The query port takes a read token by default, and local readers find it themselves.

serve started without read tokens keeps an operator token in `<store>/query-token` (0600,
reused on restart) and answers 401 without it; the CLI and the dashboard's store access,
given only `http://127.0.0.1:<port>`, find it through the discovery file serve leaves in
this user's state directory (`HANDOFFS_STATE_DIR` here, so the test's files are its own),
and never send it to a port the named serve no longer holds. An open port needs
`--query-port-open`.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from foundation.read_token import discovery_path, find_token
from foundation.store import parse_store
from serve.testing import free_port


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of this test's own, for serve, the CLI and this process."""
    d = tmp_path / "state"
    monkeypatch.setenv("HANDOFFS_STATE_DIR", str(d))
    monkeypatch.delenv("HANDOFFS_PASSWORD", raising=False)
    monkeypatch.delenv("HANDOFFS_QUERY_TOKENS", raising=False)
    monkeypatch.delenv("HANDOFFS_QUERY_PORT_OPEN", raising=False)
    return d


def _query(url: str, token: str | None = None) -> requests.Response:
    auth = ("reader", token) if token is not None else None
    return requests.post(url + "/", data=b"SELECT 1", auth=auth, timeout=30)


def test_without_tokens_the_query_port_needs_the_token_serve_keeps(start_serve, state_dir):
    h = start_serve()
    token_file = h.store_dir / "query-token"
    st = token_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    token = token_file.read_text().strip()
    assert len(token) >= 32
    assert _query(h.query_url).status_code == 401
    assert _query(h.query_url, "not-the-token").status_code == 401
    r = _query(h.query_url, token)
    assert (r.status_code, r.text) == (200, "1\n")
    assert h.health()["query_auth"] == "on"
    assert "query auth on" in h.log() and str(token_file) in h.log()
    assert token not in h.log()
    # reused, not replaced, on the next start
    assert h.stop() == 0
    h2 = start_serve(store_dir=h.store_dir)
    assert token_file.read_text().strip() == token
    assert _query(h2.query_url, token).status_code == 200


def test_the_cli_and_the_dashboard_find_the_token_themselves(start_serve, state_dir):
    h = start_serve()
    found = discovery_path(h.query_port)
    assert found.parent == state_dir
    assert stat.S_IMODE(found.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert "HANDOFFS_PASSWORD" not in os.environ
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "metrics", "--store", h.query_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["volume"] == 0
    from dashboard._store import open_client, resolve_target

    client = open_client(resolve_target(h.query_url, h.database))
    assert client.command("SELECT 1") == 1
    # an explicit password wins over the discovered one
    assert parse_store(f"http://reader:mine@127.0.0.1:{h.query_port}").password == "mine"
    assert h.stop() == 0
    assert not found.exists(), "serve left its discovery file behind"


def test_the_cli_given_the_embedded_store_serve_holds_reads_through_its_port(
    start_serve, state_dir
):
    """Beside a running serve (the demo), `--store chdb://<its store>` or the default store
    reaches the store through serve's query port instead of failing on the engine's lock."""
    h = start_serve()
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "metrics", "--store", f"chdb://{h.store_dir}",
         "--database", h.database, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["volume"] == 0
    assert "Cannot lock file" not in r.stderr
    assert h.stop() == 0
    # serve gone: the store opens embedded, as before
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "metrics", "--store", f"chdb://{h.store_dir}",
         "--database", h.database, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_a_stale_or_shared_discovery_file_hands_out_no_token(start_serve, state_dir):
    h = start_serve()
    token = h.query_token
    assert token and find_token("127.0.0.1", h.query_port) == token
    assert find_token("10.1.2.3", h.query_port) is None  # never off loopback
    doc = discovery_path(h.query_port).read_text()
    assert h.stop() == 0
    # serve killed (the file left behind), something else listening on its port now
    with socket.create_server(("127.0.0.1", h.query_port)):
        discovery_path(h.query_port).write_text(doc)
        discovery_path(h.query_port).chmod(0o600)
        assert find_token("127.0.0.1", h.query_port) is None
        assert parse_store(h.query_url).password == ""
    # a discovery file others can read is not trusted
    h2 = start_serve(store_dir=h.store_dir, query_port=h.query_port)
    discovery_path(h2.query_port).chmod(0o644)
    assert find_token("127.0.0.1", h2.query_port) is None
    discovery_path(h2.query_port).chmod(0o600)
    assert find_token("127.0.0.1", h2.query_port) == token


def test_an_open_query_port_needs_its_flag_and_says_so(start_serve, state_dir):
    h = start_serve(query_port_open=True)
    assert _query(h.query_url).status_code == 200
    assert h.health()["query_auth"] == "off"
    assert "no read tokens" in h.log() and "--query-port-open" in h.log()
    assert not (h.store_dir / "query-token").exists()
    assert not discovery_path(h.query_port).exists()


def test_read_tokens_and_an_open_port_exclude_each_other(tmp_path, state_dir):
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "serve", "--store", f"chdb://{tmp_path / 'data'}",
         "--otlp-port", str(free_port()), "--query-port", str(free_port()), "--grpc-port", "0",
         "--query-port-open"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "HANDOFFS_QUERY_TOKENS": "rd=*"},
    )  # fmt: skip
    assert r.returncode == 2 and "exclude each other" in r.stderr, r.stderr
    assert not (tmp_path / "data").exists()
