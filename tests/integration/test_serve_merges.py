"""serve runs the embedded ClickHouse's background merge threads at a lower CPU priority
(serve._tuning.MergePriority): stored spans first under full load, merges catch up after."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve._tuning import MERGE_THREAD
from serve.testing import start_serve

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc only")


def _nice_of(pid: int, comm: str) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == comm:
                out.append(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
        except OSError:
            continue
    return out


def _wait_nice(pid: int, want: int) -> list[int]:
    deadline = time.monotonic() + 20
    nices = _nice_of(pid, MERGE_THREAD)
    while time.monotonic() < deadline and not (nices and set(nices) == {want}):
        time.sleep(0.2)
        nices = _nice_of(pid, MERGE_THREAD)
    return nices


def test_merge_threads_run_at_nice_10_by_default(tmp_path: Path) -> None:
    serve = start_serve(tmp_path)
    try:
        assert _wait_nice(serve.process.pid, 10) != []
        assert set(_wait_nice(serve.process.pid, 10)) == {10}
        # serve's own threads (the main one here) keep their priority
        stat = Path(f"/proc/{serve.process.pid}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[16]) == 0
    finally:
        assert serve.stop() == 0


def test_merge_nice_from_the_environment(tmp_path: Path) -> None:
    # (0 turning it off is decided without a process: tests/unit/test_serve_tuning.py)
    serve = start_serve(tmp_path, env={"HANDOFFS_MERGE_NICE": "15"})
    try:
        assert set(_wait_nice(serve.process.pid, 15)) == {15}
    finally:
        serve.stop()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--merge-nice", "20"], {}, "--merge-nice must be 0 to 19, got 20"),
        (["--merge-nice", "-1"], {}, "--merge-nice must be 0 to 19, got -1"),
        ([], {"HANDOFFS_MERGE_NICE": "abc"}, "HANDOFFS_MERGE_NICE must be an integer, got 'abc'"),
    ],
)
def test_bad_merge_nice_is_a_usage_error(tmp_path: Path, args, env, message) -> None:
    import os

    r = subprocess.run(
        [sys.executable, "-m", "handoffs", "serve", "--store", f"chdb://{tmp_path}/s", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"handoffs serve: {message}"
    assert not (tmp_path / "s").exists()  # refused before touching the store


def test_embedded_engine_merges_one_at_a_time_and_catches_up(tmp_path: Path) -> None:
    # foundation.store.ENGINE_OPTIONS: one merge thread, one merge at a time (chDB's default is
    # 2 threads queueing 2 merges each; four merges at once held 250-300 MB in serve)
    import requests

    from ingest.testing import request_json, span_json, transition

    serve = start_serve(tmp_path)
    try:
        client = serve.client()
        rows = client.query(
            "SELECT name, value FROM system.server_settings WHERE name IN "
            "('background_pool_size', 'background_merges_mutations_concurrency_ratio') ORDER BY name"
        ).result_rows
        assert {name: value for name, value in rows} == {
            "background_merges_mutations_concurrency_ratio": "1",
            "background_pool_size": "1",
        }
        # eight writes, eight parts of otel_traces: the one merge thread merges them
        for k in range(8):
            span = span_json(
                trace_id=f"{k + 1:032x}",
                span_id=f"{k + 1:016x}",
                attributes=transition(f"h-merge-{k}", "create", "", "created"),
                start_ns=1_764_000_000_000_000_000 + k,
            )
            r = requests.post(f"{serve.otlp_url}/v1/traces", json=request_json([span]), timeout=30)
            assert r.status_code == 200, r.text
            serve.wait_stored(60)
        parts_sql = (
            "SELECT count() FROM system.parts WHERE active AND database = 'handoffs' "
            "AND table = 'otel_traces'"
        )
        deadline = time.monotonic() + 60
        parts = client.query(parts_sql).result_rows[0][0]
        while parts > 4 and time.monotonic() < deadline:
            time.sleep(0.5)
            parts = client.query(parts_sql).result_rows[0][0]
        # (the merge selector leaves a few small parts for later merges)
        assert parts <= 4, f"{parts} active parts of otel_traces after 60 s"
        assert client.query("SELECT count() FROM handoffs.otel_traces").result_rows[0][0] == 8
        client.close()
    finally:
        serve.stop()
