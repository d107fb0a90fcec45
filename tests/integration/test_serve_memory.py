"""serve's process stays lean: the dataframe libraries never load in it (a smaller RSS).

chDB imports pyarrow/numpy when installed and clickhouse-connect imports pandas/numpy on
every insert; serve blocks those optional imports (serve._tuning, HANDOFFS_KEEP_DATAFRAME_LIBS_OUT).
This checks the real serve process after it stored a request and answered a query.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve

_LIBS = ("/pandas/", "/numpy/", "/pyarrow/", "/polars/")


def test_serve_process_never_maps_dataframe_libraries(tmp_path: Path) -> None:
    serve = start_serve(tmp_path)
    try:
        t0 = time.time_ns()
        spans = [
            span_json(
                trace_id=f"{i + 1:032x}",
                span_id=f"{i + 1:016x}",
                attributes=transition(f"h-mem-{i}", "create", "", "created"),
                start_ns=t0 + i,
            )
            for i in range(5)
        ]
        r = requests.post(
            f"{serve.otlp_url}/v1/traces",
            data=request_protobuf(spans),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert serve.wait_stored(60)["stored"] == 5
        client = serve.client()
        try:
            assert client.query("SELECT count() FROM handoff_transitions").result_rows[0][0] == 5
        finally:
            client.close()
        maps = Path(f"/proc/{serve.process.pid}/maps").read_text()
        loaded = sorted({lib.strip("/") for lib in _LIBS if lib in maps})
        assert loaded == [], f"serve mapped {loaded}"
    finally:
        serve.stop()


def test_the_dataframe_libraries_load_when_allowed(tmp_path: Path) -> None:
    # HANDOFFS_KEEP_DATAFRAME_LIBS_OUT=0: chDB imports pyarrow (and numpy) when installed
    pytest.importorskip("pyarrow")
    serve = start_serve(tmp_path, env={"HANDOFFS_KEEP_DATAFRAME_LIBS_OUT": "0"})
    try:
        maps = Path(f"/proc/{serve.process.pid}/maps").read_text()
        assert "/pyarrow/" in maps
    finally:
        serve.stop()
