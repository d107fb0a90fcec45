"""The shim's own payload hash makes `idempotency_conflict` work without the emitter's help:
real OTel SDK and OTLP/HTTP exporter into a real `handoffs serve`, read with
analytics.anomalies. Each case runs in its own hour (its own window) with its own keys."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import analytics
from collector import Envelope, HandoffTracer
from collector.tracer import Handoff

HOUR = 3_600 * 10**9
#: recent (the tables' TTL drops old months), whole hours ago, one hour per case
T0 = (time.time_ns() // HOUR - 8) * HOUR


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("payload-hash"))
    yield s
    s.stop()


def _send(serve, case: int, emit) -> None:
    """Run `emit(billing, payments)` with tracers on a real exporter, times inside hour `case`."""
    tick = iter(range(T0 + case * HOUR, T0 + (case + 1) * HOUR, 10**9))
    provider = TracerProvider(resource=Resource.create({"service.name": "payload-hash"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"))
    )
    billing = HandoffTracer("billing", tracer_provider=provider, clock=lambda: next(tick))
    payments = HandoffTracer("payments", tracer_provider=provider, clock=lambda: next(tick))
    emit(billing, payments)
    provider.force_flush()
    provider.shutdown()
    serve.wait_stored()


def _refund(hid: str, key: str, objective: str, **kw: object) -> Envelope:
    return Envelope(
        task_id="refund-task",
        handoff_id=hid,
        from_agent="billing",
        to_agent="payments",
        mode="delegate",
        idempotency_key=key,
        objective=objective,
        **kw,  # type: ignore[arg-type]
    )


def _done(payments: HandoffTracer, h: Handoff) -> None:
    r = payments.receive(h.to_wire())
    r.accept()
    r.start()
    r.commit(receipt_status="ok", evidence_count=1, evidence_valid=True, evidence_refs=["rcpt:1"])


def _flagged(serve, case: int) -> dict[str, tuple[int, list[str]]]:
    """Every anomaly kind flagged in hour `case`: kind -> (count, example handoff ids)."""
    start = datetime.fromtimestamp((T0 + case * HOUR) / 1e9, UTC)
    end = datetime.fromtimestamp((T0 + (case + 1) * HOUR) / 1e9, UTC)
    with serve.client() as c:
        df = analytics.anomalies(
            c, database=serve.database, window=analytics.Window(start=start, end=end)
        )
    return {r.kind: (r.count, sorted(r.examples)) for r in df.itertuples() if r.count}


def _hashes(serve, prefix: str) -> dict[str, str]:
    with serve.client() as c:
        rows = c.query(
            f"SELECT handoff_id, payload_hash FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND startsWith(handoff_id, {p:String}) ORDER BY time",
            parameters={"p": prefix},
        ).result_rows
    return {h: p for h, p in rows}


def test_same_key_with_a_changed_amount_is_one_conflict(serve):
    def emit(billing, payments):
        _done(payments, billing.create(_refund("c-h1", "c-key", "refund 10 EUR")))
        h2 = billing.create(_refund("c-h2", "c-key", "refund 1,000 EUR"))
        # the receiver refuses a used key (committing it too would add duplicate_execution)
        payments.receive(h2.to_wire()).reject(error_code="conflict")

    _send(serve, 0, emit)
    hashes = _hashes(serve, "c-")
    assert len(set(hashes.values())) == 2 and all(h.startswith("sha256:") for h in hashes.values())
    # one conflicting key, flagged on both handoffs that hold it (count = distinct handoffs)
    assert _flagged(serve, 0) == {"idempotency_conflict": (2, ["c-h1", "c-h2"])}


def test_the_same_payload_resent_under_its_key_is_no_conflict(serve):
    def emit(billing, payments):
        h = billing.create(_refund("r-h1", "r-key", "refund 10 EUR"))
        h.redeliver()  # the create delivered twice (at-least-once)
        _done(payments, h)
        h2 = billing.create(_refund("r-h2", "r-key", "refund 10 EUR"))  # a resend, new id
        _done(payments, h2)

    _send(serve, 1, emit)
    assert len(set(_hashes(serve, "r-").values())) == 1
    # no conflict; the existing rules still see the redelivery and the second execution
    assert _flagged(serve, 1) == {
        "duplicate_delivery": (1, ["r-h1"]),
        "duplicate_execution": (1, ["r-h2"]),
    }


def test_different_keys_with_different_payloads_are_no_conflict(serve):
    def emit(billing, payments):
        _done(payments, billing.create(_refund("d-h1", "d-key1", "refund 10 EUR")))
        _done(payments, billing.create(_refund("d-h2", "d-key2", "refund 1,000 EUR")))

    _send(serve, 2, emit)
    assert len(set(_hashes(serve, "d-").values())) == 2
    assert _flagged(serve, 2) == {}


def test_a_caller_given_hash_is_stored_as_given(serve):
    def emit(billing, payments):
        env = _refund("g-h1", "g-key", "refund 10 EUR", payload_hash="caller:refund-7:v1")
        _done(payments, billing.create(env))
        # the caller says the payload is the same: its hash wins over the changed objective
        env2 = _refund("g-h2", "g-key", "refund 1,000 EUR", payload_hash="caller:refund-7:v1")
        _done(payments, billing.create(env2))

    _send(serve, 3, emit)
    assert _hashes(serve, "g-") == {"g-h1": "caller:refund-7:v1", "g-h2": "caller:refund-7:v1"}
    assert _flagged(serve, 3) == {"duplicate_execution": (1, ["g-h2"])}  # no conflict
