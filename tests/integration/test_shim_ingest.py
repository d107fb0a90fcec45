"""The shim's spans through the real OTLP encoding and the real ingest path into chDB.

Sender and receiver each have their own SDK provider; their spans are encoded with the OTel
exporter's protobuf encoder and stored by the same pure functions serve uses
(ingest_requests), then read back from handoff_transitions.
"""

from __future__ import annotations

import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from collector import Envelope, HandoffTracer, InMemoryRecorder
from ingest import ingest_requests


def test_shim_spans_are_stored_as_valid_typed_transitions(chdb_client, fresh_db):
    s_rec, r_rec = InMemoryRecorder(), InMemoryRecorder()
    planner = HandoffTracer("planner", tracer_provider=s_rec.provider)
    coder = HandoffTracer("coder", tracer_provider=r_rec.provider)
    late = HandoffTracer("coder", tracer_provider=r_rec.provider, strict=False)
    env = Envelope(
        task_id="t1",
        handoff_id="h1",
        from_agent="planner",
        to_agent="coder",
        mode="delegate",
        capabilities=("code.write", "repo.read"),
        deadline_ms=60_000,
        idempotency_key="k1",
        topology="agent_as_tool",
        objective="fix bug 12 with password=hunter2",
    )
    t = time.time_ns() - 3_600 * 10**9  # recent: the tables' TTL drops old months
    h = planner.create(env, at=t - 10**9)
    h2 = coder.receive(h.to_wire())
    h2.accept(at=t)
    h2.start(at=t + 1)
    h2.prepare(at=t + 2, evidence_count=2, evidence_valid=True, evidence_refs=["doc:1", "test:2"])
    h2.commit(at=t + 3, receipt_status="ok", receipt_hash="sha256:0f", result_version="v1")
    h2.redeliver(at=t + 4)
    late.receive(h2.to_wire()).transition("fail", at=t + 5, error_code="late")

    body = encode_spans([*s_rec.spans(), *r_rec.spans()]).SerializeToString()
    summary = ingest_requests(chdb_client, fresh_db, [("protobuf", body, "memory")], source="test")
    assert summary.stored == 7

    rows = chdb_client.query(
        "SELECT event, from_state, to_state, actor, valid, trace_id, capabilities, deadline_ms, "
        "evidence_count, evidence_valid, evidence_refs, receipt_status, "
        "attributes['handoff.objective.summary'] "
        f"FROM {fresh_db}.handoff_transitions ORDER BY time, event"
    ).result_rows
    assert [r[:5] for r in rows] == [
        ("create", "", "created", "planner", True),
        ("accept", "created", "accepted", "coder", True),
        ("start", "accepted", "running", "coder", True),
        ("prepare", "running", "prepared", "coder", True),
        ("commit", "prepared", "committed", "coder", True),
        ("commit", "prepared", "committed", "coder", True),  # the redelivered duplicate
        ("fail", "committed", "failed", "coder", False),  # lenient: stored, flagged
    ]
    assert {r[5] for r in rows} == {h.trace_id}  # one trace on both sides
    create, prepare, commit = rows[0], rows[3], rows[4]
    assert create[6] == ["code.write", "repo.read"] and create[7] == 60_000
    assert "hunter2" not in create[12] and "password=[REDACTED]" in create[12]
    assert (prepare[8], prepare[9], prepare[10]) == (2, True, ["doc:1", "test:2"])
    assert commit[11] == "ok"
