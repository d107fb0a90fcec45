"""Evidence packages: content, verification, tampering detection, the CLI's exit codes, and a
package made from data sent through a real `handoffs serve`."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics import evidence_package, verify_package
from handoffs.cli import main
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
EV = {
    "handoff.evidence.count": 2,
    "handoff.evidence.valid": True,
    "handoff.evidence_refs": ["doc:1", "test:2"],
}


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def _history() -> list[T]:
    exec_attrs = {**EV, "handoff.execution.id": "run-7", "handoff.execution.version": "coder@1.2"}
    return [
        create(
            "h1",
            s(0),
            task_id="t1",
            to_agent="coder",
            capabilities=["code.write"],
            deadline_ms=60_000,
            idempotency_key="k1",
            **{"handoff.objective.summary": "fix bug 12"},
        ),
        T("h1", "accept", "created", "accepted", s(1), actor="coder"),
        T("h1", "start", "accepted", "running", s(2), actor="coder"),
        T("h1", "prepare", "running", "prepared", s(3), actor="coder", attrs=exec_attrs),
        T(
            "h1",
            "commit",
            "prepared",
            "committed",
            s(4),
            actor="coder",
            attrs={"handoff.receipt.status": "ok", "handoff.receipt.hash": "sha256:0f"},
        ),
        T("h1", "accept", "created", "accepted", s(1), actor="coder", copy=1),  # duplicate delivery
        create("h2", s(0), task_id="t2"),
    ]


@pytest.fixture
def db(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _history())
    return fresh_db


def test_package_content(chdb_client, reader, db):
    pkg = evidence_package(reader, database=db, handoff_id="h1", as_of=s(3600))
    assert pkg is not None
    assert (pkg["handoff_id"], pkg["task_id"], pkg["tenant"]) == ("h1", "t1", "default")
    assert pkg["envelope"]["mode"] == "delegate" and pkg["envelope"]["to_agent"] == "coder"
    assert pkg["input_summary"]["objective_summary"] == "fix bug 12"
    assert pkg["evidence_refs"] == ["doc:1", "test:2"]
    assert pkg["execution"]["execution_id"] == "run-7"
    # machine order; the duplicate accept is kept (it is stored) right after the first
    assert [t["event"] for t in pkg["transitions"]] == [
        "create",
        "accept",
        "accept",
        "start",
        "prepare",
        "commit",
    ]
    assert pkg["transitions"][1]["time"] == "2026-11-23T10:00:01.000000000Z"
    assert (
        pkg["terminal"]["state"] == "committed"
        and pkg["terminal"]["receipt"]["hash"] == "sha256:0f"
    )
    assert pkg["anomalies"] == ["duplicate_delivery"]
    integ = pkg["integrity"]
    assert len(integ["chain"]) == 6 and integ["chain_head"] == integ["chain"][-1]
    assert integ["ledger"] == {"rows": 6, "matched": 6, "mismatched": [], "missing": [], "ok": True}
    assert integ["typed_columns"]["mismatched"] == []
    assert integ["log"]["head"] is None  # seeded without serve: no signed head
    assert evidence_package(reader, database=db, handoff_id="nope") is None
    # a non-handoff span of the same trace (e.g. the coder's tool call) is a related span
    trace = pkg["transitions"][0]["trace_id"]
    chdb_client.insert(f"{db}.otel_traces", [[s(2.5), trace, "00000000000000aa", "tool.run", "coder"]],
                       column_names=["Timestamp", "TraceId", "SpanId", "SpanName", "ServiceName"])  # fmt: skip
    again = evidence_package(reader, database=db, handoff_id="h1", as_of=s(3600))
    assert again is not None
    assert [(r["span_id"], r["name"]) for r in again["related_spans"]] == [
        ("00000000000000aa", "tool.run")
    ]
    res = verify_package(reader, pkg, database=db)
    assert res.ok and res.problems == []


def test_tampering_with_a_stored_row_is_detected_and_named(chdb_client, reader, db):
    pkg = evidence_package(reader, database=db, handoff_id="h1")
    assert pkg is not None
    start_span = next(t["span_id"] for t in pkg["transitions"] if t["event"] == "start")
    chdb_client.command(
        f"ALTER TABLE {db}.handoff_transitions UPDATE actor = 'mallory' WHERE span_id = {{s:String}}",
        parameters={"s": start_span},
        settings={"mutations_sync": 2},
    )
    res = verify_package(reader, pkg, database=db)
    assert not res.ok
    assert (
        f"span_id={start_span}: stored row differs from the package (column actor)" in res.problems
    )
    assert any(
        p.startswith(f"span_id={start_span}: stored row does not match the ingest ledger")
        for p in res.problems
    )
    assert all(start_span in p for p in res.problems)  # only the tampered row is named
    # a package made AFTER the tampering still fails: the ledger remembers the ingested row
    later = evidence_package(reader, database=db, handoff_id="h1")
    assert later is not None
    assert later["integrity"]["ledger"]["mismatched"] == [start_span]
    res2 = verify_package(reader, later, database=db)
    assert not res2.ok and res2.problems == [
        f"integrity.ledger.mismatched: at export ['{start_span}']",
        f"span_id={start_span}: stored row does not match the ingest ledger",
    ]


def test_deleted_and_added_rows_are_named(chdb_client, reader, db):
    pkg = evidence_package(reader, database=db, handoff_id="h1")
    assert pkg is not None
    commit_span = next(t["span_id"] for t in pkg["transitions"] if t["event"] == "commit")
    chdb_client.command(
        f"ALTER TABLE {db}.handoff_transitions DELETE WHERE span_id = {{s:String}}",
        parameters={"s": commit_span},
        settings={"mutations_sync": 2},
    )
    seed(chdb_client, db, [T("h1", "verify", "committed", "verified", s(5))], ledger=False)
    problems = verify_package(reader, pkg, database=db).problems
    assert any(
        p.startswith(f"span_id={commit_span}: in the package but no longer stored")
        for p in problems
    )
    assert any("stored but not in the package" in p for p in problems)


def test_cli_evidence_and_verify_exit_codes(chdb_client, db, chdb_path, tmp_path, capsys):
    store = ["--store", f"chdb://{chdb_path}", "--database", db]
    out = tmp_path / "h1.json"
    assert main(["evidence", "h1", *store, "--out", str(out)]) == 0
    human = capsys.readouterr().out
    assert "accepted" in human and "ledger 6/6 match" in human
    assert main(["evidence", "h1", *store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {
        "handoff_id",
        "task_id",
        "envelope",
        "transitions",
        "terminal",
        "anomalies",
        "integrity",
    } <= set(doc)
    assert main(["evidence", "verify", str(out), *store]) == 0
    assert "OK" in capsys.readouterr().out
    pkg = json.loads(out.read_text())
    pkg["transitions"][3]["actor"] = "mallory"  # edit the file: row hash + package hash break
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(pkg))
    assert main(["evidence", "verify", str(bad), *store, "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    span = pkg["transitions"][3]["span_id"]
    assert not res["ok"] and any(f"span_id={span}" in p for p in res["problems"])
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert main(["evidence", "verify", str(garbage), *store]) == 2
    assert main(["evidence", "verify", str(tmp_path / "missing.json"), *store]) == 2
    assert main(["evidence", "missing-id", *store]) == 1
    assert main(["evidence", "h1", *store, "--out", str(tmp_path / "no" / "dir.json")]) == 2
    capsys.readouterr()
    assert (
        main(["evidence", "verify", str(out), "--store", "http://127.0.0.1:9", "--database", db])
        == 3
    )
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_verify_package_made_from_data_sent_through_serve(serve_process, tmp_path, capsys):
    from ingest.testing import request_json, span_json, transition

    now = time.time_ns() - 60 * 10**9
    steps = [("create", "", "created"), ("accept", "created", "accepted"), ("start", "accepted", "running"),
             ("commit", "running", "committed")]  # fmt: skip
    evidence: dict[str, Any] = {"handoff__evidence__count": 1, "handoff__evidence__valid": True}
    spans = [
        span_json(
            trace_id="ab" * 16,
            span_id=f"{i + 1:016x}",
            start_ns=now + i * 10**9,
            attributes=transition(
                "hs1",
                ev,
                f,
                t,
                **(evidence if ev == "commit" else {}),
            ),
        )
        for i, (ev, f, t) in enumerate(steps)
    ]
    req = urllib.request.Request(
        f"{serve_process.otlp_url}/v1/traces",
        data=json.dumps(request_json(spans)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    serve_process.wait_stored()
    store = ["--store", serve_process.query_url, "--database", serve_process.database]
    out = tmp_path / "hs1.json"
    assert main(["evidence", "hs1", *store, "--out", str(out), "--json"]) == 0
    pkg = json.loads(capsys.readouterr().out)
    assert [t["event"] for t in pkg["transitions"]] == ["create", "accept", "start", "commit"]
    assert pkg["integrity"]["ledger"]["matched"] == 4  # serve wrote the ledger rows
    assert main(["evidence", "verify", str(out), *store]) == 0
    assert main(["metrics", *store, "--json", "--from", "2000-01-01T00:00:00Z"]) == 0
    capsys.readouterr()
