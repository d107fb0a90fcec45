"""Fixtures shared by the integration tests."""

from __future__ import annotations

import threading

import pytest


@pytest.fixture(scope="module")
def derive_serve(tmp_path_factory):
    """A `handoffs serve` with derivation every 0.25 s for one derived-handoff test module
    (per module: an idle serve passing every 0.25 s would cost CPU for the rest of the run)."""
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("derive"), env={"HANDOFFS_DERIVE_EVERY_S": "0.25"})
    yield s
    s.stop()


@pytest.fixture
def serve_on():
    """start(ingestor, max_body=1 MiB) -> the URL of an OTLP/HTTP receiver over `ingestor`
    on a free loopback port, in a thread; every receiver started is shut down after."""
    from ingest._otlp_http import OtlpConfig, make_otlp_server

    servers = []

    def start(ingestor, max_body: int = 1 << 20) -> str:
        srv = make_otlp_server("127.0.0.1", 0, ingestor, OtlpConfig(max_body, {}))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1/traces"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()
