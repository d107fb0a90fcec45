"""The code in docs/agent-developers.md runs as written against a real `handoffs serve`.

Each end-to-end ```python block (the shim's and plain OTel's: the ones naming a handoff
the test then reads back; the others are run by the unit tests of their features) is
executed in its own process with only the standard OTel variables
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
    "handoff_id", ["task-42/coder/1", "ticket-7781/billing/1"], ids=["shim", "plain-otel"]
)
def test_doc_example_runs_and_lands(serve, handoff_id):
    blocks = [b for b in BLOCKS if f'"{handoff_id}"' in b]
    assert len(blocks) == 1, f"one ```python block of docs/agent-developers.md names {handoff_id}"
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": serve.otlp_url,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer demo-acme",
    }
    r = subprocess.run(
        [sys.executable, "-c", blocks[0]], env=env, capture_output=True, text=True, timeout=60
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
