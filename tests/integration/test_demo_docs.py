"""The code in docs/agent-developers.md runs as written against a real `handoffs serve`.

Each ```python block is executed in its own process with only the standard OTel variables
set (endpoint + tenant token), exactly as a reader would; then the handoffs it describes
must be stored under the token's tenant, valid and committed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-developers.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("docs"), "demo-acme=acme")
    yield s
    s.stop()


@pytest.mark.parametrize(
    ("index", "handoff_id"),
    [(0, "task-42/coder/1"), (1, "ticket-7781/billing/1")],
    ids=["shim", "plain-otel"],
)
def test_doc_example_runs_and_lands(serve, index, handoff_id):
    assert len(BLOCKS) == 2
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": serve.otlp_url,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer demo-acme",
    }
    r = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    serve.wait_stored(60)
    client = serve.client()
    rows = client.query(
        f"SELECT tenant, event, valid, to_state FROM {serve.database}.handoff_transitions "
        "WHERE handoff_id = {h:String} ORDER BY time",
        parameters={"h": handoff_id},
    ).result_rows
    assert [r[1] for r in rows] == ["create", "accept", "start", "commit"]
    assert {r[0] for r in rows} == {"acme"} and all(r[2] for r in rows)
    assert rows[-1][3] == "committed"
