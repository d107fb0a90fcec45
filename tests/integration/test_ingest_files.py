"""`handoffs ingest FILE...` as a user runs it (subprocess: it opens its own embedded store)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time

import pytest

from ingest import read_requests
from ingest.testing import request_json, request_protobuf, span_json, transition


def _spans(tag: str, n: int, *, bad: int = 0):
    out = []
    for i in range(n):
        a = transition(f"{tag}-{i}", "create", "", "created")
        if i < bad:
            a["handoff.deadline_ms"] = "tomorrow"
        out.append(
            span_json(
                trace_id=f"{abs(hash((tag, i))) | 1:032x}"[-32:],
                span_id=f"{abs(hash((tag, i, 's'))) | 1:016x}"[-16:],
                attributes=a,
                start_ns=time.time_ns() + i,
            )
        )
    return out


@pytest.fixture
def files(tmp_path):
    jsonl = tmp_path / "collector-file-exporter.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(request_json(_spans(f"l{k}", 3, bad=1 if k == 0 else 0))) for k in range(3)
        )
        + "\n"
    )
    pb = tmp_path / "one.pb"
    pb.write_bytes(request_protobuf(_spans("pb", 4)))
    framed = tmp_path / "framed.binpb.gz"
    msgs = [request_protobuf(_spans(f"f{k}", 2)) for k in range(2)]
    framed.write_bytes(gzip.compress(b"".join(len(m).to_bytes(4, "big") + m for m in msgs)))
    return [jsonl, pb, framed]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "handoffs", "ingest", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_read_requests_understands_each_format(files):
    jsonl, pb, framed = files
    assert [f for f, _, _ in read_requests(jsonl)] == ["json"] * 3
    assert [f for f, _, _ in read_requests(pb)] == ["protobuf"]
    assert [w for _, _, w in read_requests(framed)] == [
        f"{framed}:message 0",
        f"{framed}:message 1",
    ]


def test_ingest_files_then_again_stores_nothing_twice(files, tmp_path):
    store = f"chdb://{tmp_path / 'data'}"
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": 5}')
    first = _run("--store", store, "--json", *map(str, files), str(bad))
    assert first.returncode == 2, first.stderr  # bad input in one file: reported, exit 2
    s = json.loads(first.stdout)
    assert s["files"] == 4 and s["requests"] == 7
    assert s["spans_read"] == 9 + 4 + 4
    assert s["stored"] == 16 and s["rejected"] == 1 and s["duplicates"] == 0
    assert s["reject_reasons"] == {"attribute handoff.deadline_ms must be int, got string": 1}
    assert len(s["errors"]) == 1 and "resourceSpans: expected an array" in s["errors"][0]
    again = _run("--store", store, *map(str, files))
    assert again.returncode == 0, again.stderr
    assert "stored 0  duplicates 17  rejected 0" in again.stdout


def test_locked_store_says_so_and_otlp_sends_through_serve(files, start_serve, tmp_path):
    serve = start_serve(tokens="tok=acme")
    r = _run("--store", f"chdb://{serve.store_dir}", str(files[0]))
    assert r.returncode == 3
    assert "locked by another process" in r.stderr and "--otlp" in r.stderr
    r = _run("--otlp", serve.otlp_url, "--token", "tok", "--json", str(files[0]))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["stored"], s["rejected"]) == (8, 1)
    serve.wait_stored()
    ch = serve.client()
    assert ch.query(
        "SELECT tenant, count() FROM handoff_transitions GROUP BY tenant"
    ).result_rows == [("acme", 8)]
    ch.close()
