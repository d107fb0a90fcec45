"""The protocol-audit attributes through the real OTel SDK and OTLP/HTTP exporter into a real
`handoffs serve`, read back from handoff_transitions.attributes.

The same handoffs go twice: once batched into one large request (serve decodes it in SQL,
ingest/chdb) and once a span per request (the Python decoder). Both must be stored, none
refused, typed per the storage encoding (int as decimal text, bool as true/false, string[]
as JSON text), and the two paths must store the same attribute maps.
"""

from __future__ import annotations

import json
import time

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from collector import Envelope, EnvelopeError, EvidenceRef, HandoffTracer, semconv
from collector.envelope import Grant

REPS_SQL = 40  # enough spans for one request over serve's SQL-decoding threshold (64 KiB)
GRANT = Grant(
    caller="planner",
    subject="user:42",
    tenant="default",
    capabilities=("repo.write",),
    resources=("repo:acme/api", "ci:acme"),
    expires_at="2026-12-31T00:00:00Z",
    approval="chg-981",
)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("protocol-wire"))
    yield s
    s.stop()


def emit(provider: TracerProvider, prefix: str, reps: int, t0: int) -> None:
    """Per rep: a timed-out attempt resolved then retried to a verified receipt; a blind
    retry (lenient); a refused v2 envelope; a read-back that found conflicts."""
    tick = iter(range(t0, t0 + 10**12, 1000))

    def clock() -> int:
        return next(tick)

    planner = HandoffTracer("planner", tracer_provider=provider, clock=clock)
    coder = HandoffTracer("coder", tracer_provider=provider, clock=clock)
    sloppy = HandoffTracer("planner", tracer_provider=provider, strict=False, clock=clock)
    for n in range(reps):
        p = f"{prefix}-{n}"
        env = Envelope(
            task_id=f"{p}-task",
            handoff_id=f"{p}-h1",
            from_agent="planner",
            to_agent="coder",
            mode="delegate",
            idempotency_key=f"{p}-key",
            grant=GRANT,
            evidence_refs=(
                EvidenceRef("doc:1", "spec says so", "2026-11-30T09:00:00Z"),
                EvidenceRef("test:2"),
            ),
        )
        h1 = planner.create(env)
        h1.timeout(error_code="deadline")
        h1.resolve_failed()
        h2 = h1.retry(f"{p}-h2")
        r2 = coder.receive(h2.to_wire())
        r2.accept()
        r2.start()
        r2.commit(
            receipt_id=f"{p}-rcpt",
            receipt_expires_at="2026-12-02T00:00:00Z",
            evidence_refs=[EvidenceRef("build:7", "tests pass", "2026-12-01T10:00:00Z")],
            evidence_count=1,
            evidence_valid=True,
        )
        r2.verify(read_back=True, conflicts=[])

        h3 = sloppy.create(Envelope(**{**env.to_wire(), "handoff_id": f"{p}-h3"}))
        h3.timeout()
        sloppy.retry(h3, f"{p}-h4")

        bad = {**planner.create(Envelope(**{**env.to_wire(), "handoff_id": f"{p}-h5"})).to_wire()}
        bad["protocol"] = "aa-handoff/v2"
        with pytest.raises(EnvelopeError):
            coder.receive(bad)

        h6 = planner.create(Envelope(**{**env.to_wire(), "handoff_id": f"{p}-h6"}))
        r6 = coder.receive(h6.to_wire())
        r6.accept()
        r6.start()
        r6.commit(receipt_id=f"{p}-rcpt6")
        r6.verify_fail(read_back=True, conflicts=["result_version", "receipt.hash"])


def _send(serve, prefix: str, reps: int, t0: int, *, batched: bool) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "protocol-wire"}))
    exporter = OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")
    if batched:  # everything in one export request
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=20_000,
                max_export_batch_size=20_000,
                schedule_delay_millis=3_600_000,
            )
        )
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit(provider, prefix, reps, t0)
    provider.force_flush()
    provider.shutdown()
    serve.wait_stored()


def _rows(serve, prefix: str) -> list[tuple[str, str, dict[str, str]]]:
    """(handoff id without the path prefix, event, attributes with it replaced) of rep 0."""
    with serve.client() as c:
        rows = c.query(
            f"SELECT handoff_id, event, attributes FROM {serve.database}.handoff_transitions "
            "WHERE startsWith(handoff_id, {p:String}) ORDER BY time, handoff_id, event",
            parameters={"p": f"{prefix}-0-"},
        ).result_rows
    out = []
    for hid, event, attrs in rows:
        norm = {k: v.replace(f"{prefix}-0-", "X-") for k, v in attrs.items()}
        out.append((hid.removeprefix(f"{prefix}-0-"), event, norm))
    return out


def test_new_attributes_arrive_typed_and_both_decoders_store_them_alike(serve):
    t0 = time.time_ns() - 3_600 * 10**9  # recent: the tables' TTL drops old months
    before = serve.health()
    _send(serve, "sql", REPS_SQL, t0, batched=True)
    mid = serve.health()
    assert mid["sql_decoded"] > before["sql_decoded"], "the batch went the Python way"
    assert mid["sql_declined"] == before["sql_declined"]
    _send(serve, "py", 1, t0, batched=False)
    after = serve.health()
    assert after["sql_decoded"] == mid["sql_decoded"]  # small requests: the Python decoder

    with serve.client() as c:
        rejects = c.query(f"SELECT count() FROM {serve.database}.ingest_rejects").result_rows
        stored = c.query(
            f"SELECT count() FROM {serve.database}.handoff_transitions "
            "WHERE startsWith(handoff_id, 'sql-')"
        ).result_rows
    assert rejects == [(0,)]
    per_rep = len(_rows(serve, "py"))
    assert stored == [(per_rep * REPS_SQL,)]

    sql, py = _rows(serve, "sql"), _rows(serve, "py")
    assert sql == py  # the SQL decoder stores what the Python decoder stores

    by = {(hid, ev): a for hid, ev, a in py}
    c1 = by[("h1", "create")]
    assert c1[semconv.ATTEMPT] == "1" and semconv.RETRY_OF not in c1
    assert c1[semconv.GRANT_CALLER] == "planner" and c1[semconv.GRANT_APPROVAL] == "chg-981"
    assert c1[semconv.GRANT_EXPIRES_AT] == "2026-12-31T00:00:00Z"
    assert json.loads(c1[semconv.GRANT_RESOURCES]) == ["repo:acme/api", "ci:acme"]
    assert json.loads(c1[semconv.GRANT_CAPABILITIES]) == ["repo.write"]
    assert json.loads(c1[semconv.EVIDENCE_REFS]) == ["doc:1", "test:2"]
    assert json.loads(c1[semconv.EVIDENCE_CLAIMS]) == ["spec says so", ""]
    assert json.loads(c1[semconv.EVIDENCE_VALID_AT]) == ["2026-11-30T09:00:00Z", ""]
    assert by[("h1", "timeout")][semconv.ERROR_CODE] == "deadline"

    c2 = by[("h2", "create")]
    assert (c2[semconv.ATTEMPT], c2[semconv.RETRY_OF]) == ("2", "X-h1")
    assert c2[semconv.IDEMPOTENCY_KEY] == "X-key"
    commit = by[("h2", "commit")]
    assert (commit[semconv.RECEIPT_ID], commit[semconv.RECEIPT_EXPIRES_AT]) == (
        "X-rcpt",
        "2026-12-02T00:00:00Z",
    )
    assert json.loads(commit[semconv.EVIDENCE_CLAIMS]) == ["tests pass"]
    verify = by[("h2", "verify")]
    assert verify[semconv.RECEIPT_READ_BACK] == "true"
    assert json.loads(verify[semconv.RECEIPT_CONFLICTS]) == []

    c4 = by[("h4", "create")]
    assert c4[semconv.RETRY_UNRESOLVED] == "true" and c4[semconv.ATTEMPT] == "2"
    assert c4.get(semconv.VALID, "true") == "true"

    reject = by[("h5", "reject")]
    assert reject[semconv.ERROR_CODE] == "incompatible_protocol"
    assert reject[semconv.ACTOR] == "coder"

    failed = by[("h6", "verify_fail")]
    assert json.loads(failed[semconv.RECEIPT_CONFLICTS]) == ["result_version", "receipt.hash"]

    with serve.client() as c:
        valid = c.query(
            f"SELECT handoff_id, event, valid FROM {serve.database}.handoff_transitions "
            "WHERE handoff_id IN ('py-0-h4', 'py-0-h5') ORDER BY handoff_id, event"
        ).result_rows
    assert valid == [
        ("py-0-h4", "create", True),
        ("py-0-h5", "create", True),
        ("py-0-h5", "reject", True),
    ]
