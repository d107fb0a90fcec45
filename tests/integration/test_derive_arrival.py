"""The derivation pass over a real embedded store when spans arrive as a batching exporter
sends them: the enclosing runs after the handoff's own spans, and rows that become visible
after their InsertedAt (a slow insert). The pass's clock is given; its submits are kept.

The trace is the Pydantic AI bounce of tests/unit/test_derive_pydantic_ai_rules.py: triage
asks refund, refund asks triage back from inside its run (that second delegation's cause is
the first)."""

from __future__ import annotations

import time
from dataclasses import replace

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from derive import DerivePass, SpanRecord
from tests.unit.test_derive_pydantic_ai_rules import MS, T, bounce

FIRST = "00000000000000b3"  # triage's delegation to refund (its tool span)


def _attributes(body: bytes) -> list[dict[str, object]]:
    """Each span's attributes in an OTLP/protobuf request, read with the OTLP proto package."""
    req = ExportTraceServiceRequest.FromString(body)
    return [
        {kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value")
         for kv in span.attributes}
        for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans
    ]  # fmt: skip


def _rows(spans: list[SpanRecord], t0_ns: int) -> list[list[object]]:
    return [
        [
            t0_ns + s.start_ns, s.trace_id, s.span_id, s.parent_span_id, s.name, s.scope,
            s.service_name, dict(s.attributes), s.end_ns - s.start_ns, s.status, "default",
            s.stored_s,
        ]
        for s in spans
    ]  # fmt: skip


class Store:
    """Writes spans into `db`.otel_traces with the InsertedAt each span carries."""

    def __init__(self, client, db: str, t0_ns: int) -> None:
        self.client, self.db, self.t0_ns = client, db, t0_ns

    def put(self, spans: list[SpanRecord], stored_s: int) -> None:
        self.client.insert(
            f"{self.db}.otel_traces",
            _rows([replace(s, stored_s=stored_s) for s in spans], self.t0_ns),
            column_names=[
                "Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "ScopeName",
                "ServiceName", "SpanAttributes", "Duration", "StatusCode", "Tenant", "InsertedAt",
            ],
        )  # fmt: skip


class Pass:
    """A DerivePass on the test's client with a clock the test sets; what it submits, kept."""

    def __init__(self, client, db: str, now: int, hold_s: float = 30.0) -> None:
        self.now = now
        self.submitted: list[dict] = []
        self.p = DerivePass(
            lambda: client,
            db,
            lambda body, tenant: self.submitted.extend(_attributes(body)),
            clock=lambda: self.now,
            hold_s=hold_s,
        )

    def run(self, at: int):
        self.now = at
        return self.p.run_once()

    def creates(self) -> dict[str, str | None]:
        """handoff id -> its causation id, of the derived creates submitted so far."""
        return {
            a["handoff.handoff_id"]: a.get("handoff.causation_id")
            for a in self.submitted
            if a["handoff.event"] == "create"
        }


def _ended_by(ms: int) -> list[SpanRecord]:
    return [s for s in bounce() if s.end_ns <= ms * MS]


def _ended_after(ms: int) -> list[SpanRecord]:
    return [s for s in bounce() if s.end_ns > ms * MS]


def test_a_handoff_is_derived_with_its_cause_when_the_enclosing_run_comes_later(
    chdb_client, fresh_db
):
    now = int(time.time())
    store, p = Store(chdb_client, fresh_db, now * 10**9), Pass(chdb_client, fresh_db, now)
    # refund's delegation back to triage and triage's nested run end first: the first request
    store.put(_ended_by(60), now)
    r = p.run(now + 1)
    assert (r.submitted, r.waiting) == (0, 1), "held: its enclosing run is not stored yet"
    r = p.run(now + 2)  # no new span: the held trace is read again, still held
    assert (r.traces, r.submitted, r.waiting) == (1, 0, 1)
    # the enclosing runs come in the next request
    store.put(_ended_after(60), now + 2)
    r = p.run(now + 3)
    assert (r.submitted, r.waiting) == (10, 0)
    assert p.creates() == {f"{T}/{FIRST}": None, f"{T}/00000000000000c3": f"{T}/{FIRST}"}
    # read again within the late-row window, unchanged: not derived again
    assert p.run(now + 4).traces == 0


def test_a_held_handoff_is_derived_without_its_cause_once_the_hold_ends(chdb_client, fresh_db):
    """A parent in a service that exports elsewhere never comes: after the hold, what is
    stored is derived."""
    now = int(time.time())
    store, p = Store(chdb_client, fresh_db, now * 10**9), Pass(chdb_client, fresh_db, now, 30)
    store.put(_ended_by(60), now)
    assert p.run(now + 1).submitted == 0
    r = p.run(now + 31)
    assert (r.submitted, r.waiting) == (5, 0)
    assert p.creates() == {f"{T}/00000000000000c3": None}


def test_rows_visible_after_the_cursor_passed_their_inserted_at_are_derived(chdb_client, fresh_db):
    """A slow insert: its rows carry the InsertedAt of its start, and show after a pass whose
    cursor is already past that second."""
    now = int(time.time())
    store, p = Store(chdb_client, fresh_db, now * 10**9), Pass(chdb_client, fresh_db, now)
    assert p.run(now + 5).submitted == 0  # the cursor is at now + 5
    store.put(bounce(), now + 2)
    r = p.run(now + 7)
    assert r.submitted == 10
    assert p.creates()[f"{T}/00000000000000c3"] == f"{T}/{FIRST}"
