"""int[] attributes on the SQL decoding path (ingest.chdb) store exactly what Python stores.

`handoff.consumer.supported_versions` (wire type int[]) on accept spans, and int or mixed
arrays on other attributes, are decoded by chDB into the same SpanAttributes text as the
Python decoder's (compact JSON: negatives, zero, the int64 bounds, empty arrays), with the
same rows, row hashes, ledger and batch hashes (test_fast_path's helpers store each request
both ways and compare every stored column). An array whose items break its wire type is
declined by the SQL path; the Python decoder rejects the span, as it always has. Through a
real serve the effect shows on /health (`sql_decoded`, `sql_declined`) and in the stored rows,
for hand-built requests and for a consumer's window sent through the real OTel SDK.
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from collector import Envelope, EnvelopeError, HandoffTracer, semconv
from ingest import SQL_MIN_BYTES
from ingest._decode import decode_protobuf
from tests.integration import test_fast_path
from tests.integration.test_fast_path import (
    TENANT,
    _assert_same,
    _declines,
    _kv,
    _store_both,
    build,
)

#: test_fast_path's fixtures: two fresh databases of the shared test store, a Stager on it
two_dbs = test_fast_path.two_dbs
stager = test_fast_path.stager

VERSIONS = semconv.CONSUMER_SUPPORTED_VERSIONS
UNKNOWN_FIELDS = semconv.ENVELOPE_UNKNOWN_FIELDS
INT64 = (-(2**63), 2**63 - 1)
EDGES: list[list[int]] = [
    [],
    [0],
    [-1],
    [1, 2, 3],
    [INT64[1]],
    [INT64[0]],
    [INT64[0], -7, 0, 7, INT64[1]],
    [2**31, -(2**31) - 1, 10**15],
    list(range(-20, 21)),
]
#: the SDK test: a consumer's window (zero and a version past 32 bits included), reps in
#: one request (enough for serve's SQL-decoding size), span times (long past: outside the
#: time windows the other tests of the shared serve read)
SDK_VERSIONS = (0, 1, 2**40)
SDK_REPS = 120
SDK_T0 = 1_764_000_000 * 10**9
#: characters whose JSON escapes differ between ClickHouse and Python (declined: see
#: test_fast_path)
_DIFFERS = "\x0b\x0e\x0f\x1a\x1b\x1c\x1d\x1e\x1f\u2028\u2029"


def _json(v: object) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _with_arrays(
    req: ExportTraceServiceRequest, versions: list[list[int]], mixed: list[list[object]]
) -> dict[str, str]:
    """Give every accept span `versions` (cycled) as supported_versions and an unknown-fields
    list, every other span an int or mixed array of no wire meaning; returns the text each
    span's arrays must be stored as (span id hex -> supported_versions, or a key=value
    summary for the others)."""
    want: dict[str, str] = {}
    n = 0
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                event = next(
                    (kv.value.string_value for kv in sp.attributes if kv.key == semconv.EVENT), ""
                )
                if event == "accept":
                    v = versions[n % len(versions)]
                    sp.attributes.extend(
                        [_kv(VERSIONS, v), _kv(UNKNOWN_FIELDS, ["x-retry", "ü"][: n % 3])]
                    )
                    want[sp.span_id.hex()] = _json(v)
                else:
                    m = mixed[n % len(mixed)]
                    sp.attributes.append(_kv("app.ports", m))
                    want[sp.span_id.hex()] = f"app.ports={_json(m)}"
                n += 1
    return want


def _stored(client, db: str, prefix: str) -> dict[str, str]:
    rows = client.query(
        f"SELECT SpanId, SpanAttributes FROM {db}.otel_traces "
        "WHERE startsWith(IngestBatch, {p:String})",
        parameters={"p": f"{prefix}-"},
    ).result_rows
    return {
        sid: attrs[VERSIONS] if VERSIONS in attrs else f"app.ports={attrs['app.ports']}"
        for sid, attrs in rows
    }


def test_int_arrays_take_the_sql_path_and_store_what_python_stores(chdb_client, two_dbs, stager):
    mixed: list[list[object]] = [[80, -443, 0], ["a", -1, "", INT64[1]], [], ['q"', 5]]
    rng = random.Random(17)
    reqs = [build(rng, n) for n in (2, 6)]
    want: dict[str, str] = {}
    for i, req in enumerate(reqs):
        want |= _with_arrays(req, EDGES[i:] + EDGES[:i], mixed)
    assert sum(v.startswith("[") for v in want.values()) >= len(EDGES)
    before = (stager.staged, stager.fallbacks)
    taken = _store_both(chdb_client, two_dbs, stager, [r.SerializeToString() for r in reqs], "ia")
    assert taken == [True, True]
    assert (stager.staged, stager.fallbacks) == (before[0] + 2, before[1])
    _assert_same(chdb_client, two_dbs, "ia")
    for db in two_dbs:
        assert _stored(chdb_client, db, "ia") == want
    # the handoff transitions and the ledger carry them too (row hashes compared above)
    got = chdb_client.query(
        f"SELECT attributes[{VERSIONS!r}] FROM {two_dbs[0]}.handoff_transitions "
        "WHERE startsWith(ingest_batch, 'ia-') AND event = 'accept'"
    ).result_rows
    assert {g for (g,) in got} >= {_json(v) for v in EDGES}


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    versions=st.lists(st.lists(st.integers(*INT64), max_size=5), min_size=1, max_size=4),
    mixed=st.lists(
        st.lists(
            st.one_of(
                st.integers(*INT64),
                st.text(st.characters(exclude_characters=_DIFFERS), max_size=6),
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_any_int_arrays_are_stored_the_same_both_ways(
    chdb_client, two_dbs, stager, versions, mixed
):
    prefix = uuid.uuid4().hex[:12]
    req = build(random.Random(len(versions) * 31 + len(mixed)), 2, texts=["t", "ü"])
    want = _with_arrays(req, versions, mixed)
    (taken,) = _store_both(chdb_client, two_dbs, stager, [req.SerializeToString()], prefix)
    assert taken, (versions, mixed)
    _assert_same(chdb_client, two_dbs, prefix)
    assert _stored(chdb_client, two_dbs[0], prefix) == want


#: malformed values of the wire arrays -> the reason the Python decoder rejects the span with
MALFORMED: list[tuple[str, object, str]] = [
    (VERSIONS, [1, "2"], "must be int[], got an array with non-int items"),
    (VERSIONS, [1, True], "must be int[], got an array with non-int items"),
    (VERSIONS, [1.5], "must be int[], got an array with non-int items"),
    (VERSIONS, [1, None], "must be int[], got an array with non-int items"),
    (VERSIONS, [[1]], "must be int[], got an array with non-int items"),
    (VERSIONS, 3, "must be int[], got int"),
    (VERSIONS, "1,2", "must be int[], got string"),
    (UNKNOWN_FIELDS, ["a", 1], "must be string[], got an array with non-string items"),
    (UNKNOWN_FIELDS, [7], "must be string[], got an array with non-string items"),
]


def _malformed(key: str, value: object) -> ExportTraceServiceRequest:
    """build()'s request with `key`=`value` on its first span (a create) only."""
    req = build(random.Random(3), 1)
    req.resource_spans[0].scope_spans[0].spans[0].attributes.append(_kv(key, value))
    return req


def test_malformed_wire_arrays_are_declined_and_python_rejects_the_span(
    chdb_client, two_dbs, stager
):
    for k, (key, value, reason) in enumerate(MALFORMED):
        req = _malformed(key, value)
        assert _declines(stager, req), (key, value)
        decoded = decode_protobuf(req.SerializeToString(), tenant=TENANT)
        sp = req.resource_spans[0].scope_spans[0].spans[0]
        assert [(r.span_id, r.reason) for r in decoded.rejects] == [
            (sp.span_id.hex(), f"attribute {key} {reason}")
        ], (key, value)
        # the request's other spans are stored the Python way
        (taken,) = _store_both(chdb_client, two_dbs, stager, [req.SerializeToString()], f"bad{k}")
        assert not taken
    assert stager.fallbacks >= 2 * len(MALFORMED)


def _serve_request(seed: int, marker: str, bad: object = None) -> tuple[bytes, dict[str, str]]:
    """A request over serve's SQL-decoding size with EDGES on its accept spans, no tenant
    claims (serve's tenant is its default), resources named after `marker`; `bad`: a
    supported_versions value added to its first span (a create)."""
    req = build(random.Random(seed), 40)
    for r, rs in enumerate(req.resource_spans):
        for kv in rs.resource.attributes:
            if kv.key == "service.name":
                kv.value.string_value = f"{marker}-{r}"
        for ss in rs.scope_spans:
            for sp in ss.spans:
                keep = [kv for kv in sp.attributes if kv.key != semconv.TENANT]
                del sp.attributes[:]
                sp.attributes.extend(keep)
    want = _with_arrays(req, EDGES, [[1, -1]])
    if bad is not None:
        req.resource_spans[0].scope_spans[0].spans[0].attributes.append(_kv(VERSIONS, bad))
    body = req.SerializeToString()
    assert len(body) >= SQL_MIN_BYTES
    return body, want


def _post(serve, body: bytes) -> ExportTraceServiceResponse:
    r = requests.post(
        f"{serve.otlp_url}/v1/traces",
        data=body,
        headers={"Content-Type": "application/x-protobuf"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    resp = ExportTraceServiceResponse()
    resp.ParseFromString(r.content)
    return resp


_COUNTERS = ("sql_decoded", "sql_declined", "stored", "rejected")


def test_serve_decodes_int_array_requests_in_sql(derive_serve):
    """One int[] request through a real serve: decoded by chDB (sql_decoded +1, nothing
    declined), stored with the JSON text; one whose int[] holds a string: declined (the
    Python decoder rejects that span alone and stores the rest)."""
    serve, marker = derive_serve, f"ia-{uuid.uuid4().hex[:8]}"
    body, want = _serve_request(29, marker)
    before = {k: serve.health()[k] for k in _COUNTERS}
    assert not _post(serve, body).HasField("partial_success")
    mid = {k: serve.wait_stored()[k] for k in _COUNTERS}
    print(f"FIGURES int[] request: /health before={before} after={mid}")
    assert mid["sql_decoded"] == before["sql_decoded"] + 1, (before, mid)
    assert mid["sql_declined"] == before["sql_declined"], (before, mid)
    assert mid["stored"] - before["stored"] == len(want)
    with serve.client() as c:
        rows = c.query(
            "SELECT SpanId, SpanAttributes FROM otel_traces WHERE startsWith(ServiceName, "
            "{m:String}) AND (mapContains(SpanAttributes, {v:String}) "
            "OR mapContains(SpanAttributes, 'app.ports'))",
            parameters={"m": marker, "v": VERSIONS},
        ).result_rows
        stored = {
            s: a[VERSIONS] if VERSIONS in a else f"app.ports={a['app.ports']}" for s, a in rows
        }
        assert stored == want

        bad, bad_want = _serve_request(31, f"{marker}-bad", bad=[1, "2"])
        first = next(iter(bad_want))  # the first span's id: the one rejected
        resp = _post(serve, bad)
        assert resp.partial_success.rejected_spans == 1
        after = {k: serve.wait_stored()[k] for k in _COUNTERS}
        print(f"FIGURES malformed int[] request: /health before={mid} after={after}")
        assert after["sql_declined"] == mid["sql_declined"] + 1, (mid, after)
        assert after["sql_decoded"] == mid["sql_decoded"], (mid, after)
        assert after["rejected"] == mid["rejected"] + 1
        assert after["stored"] - mid["stored"] == len(bad_want) - 1
        rejects = c.query(
            "SELECT reason FROM ingest_rejects WHERE span_id = {s:String}",
            parameters={"s": first},
        ).result_rows
    assert rejects == [(f"attribute {VERSIONS} must be int[], got an array with non-int items",)]


def _sdk_send(serve, prefix: str, reps: int, *, batched: bool) -> None:
    """Per rep, through the real OTel SDK and OTLP/HTTP exporter: a handoff a consumer
    with a compatibility window accepts and commits, and an envelope it refuses (a reject);
    both consumer spans carry supported_versions. `batched`: one export request (over
    serve's SQL-decoding size), else a request per span (the Python decoder)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "int-arrays"}))
    exporter = OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")
    if batched:
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
    tick = iter(range(SDK_T0, SDK_T0 + 10**12, 1000))
    planner = HandoffTracer("planner", tracer_provider=provider, clock=lambda: next(tick))
    coder = HandoffTracer(
        "coder", tracer_provider=provider, clock=lambda: next(tick), supported_versions=SDK_VERSIONS
    )
    for n in range(reps):
        p = f"{prefix}-{n}"
        env = Envelope(
            task_id=f"{p}-task", handoff_id=f"{p}-h1", from_agent="planner", to_agent="coder",
            mode="delegate", capabilities=("repo.read",),
        )  # fmt: skip
        r = coder.receive(planner.create(env).to_wire())
        r.accept()
        r.start()
        r.commit(receipt_id=f"{p}-rcpt")
        refused = planner.create(Envelope(**{**env.to_wire(), "handoff_id": f"{p}-h2"})).to_wire()
        refused["protocol"] = "aa-handoff/v9"
        with pytest.raises(EnvelopeError):
            coder.receive(refused)
    provider.force_flush()
    provider.shutdown()
    serve.wait_stored()


def _consumer_rows(serve, prefix: str) -> list[tuple[str, str, dict[str, str]]]:
    """(handoff id without the prefix, event, attributes with it replaced) of rep 0."""
    with serve.client() as c:
        rows = c.query(
            "SELECT handoff_id, event, attributes FROM handoff_transitions "
            "WHERE startsWith(handoff_id, {p:String}) ORDER BY time, handoff_id, event",
            parameters={"p": f"{prefix}-0-"},
        ).result_rows
    return [
        (
            hid.removeprefix(f"{prefix}-0-"),
            event,
            {k: v.replace(f"{prefix}-0-", "X-") for k, v in attrs.items()},
        )
        for hid, event, attrs in rows
    ]


def test_sdk_compatibility_windows_are_decoded_in_sql(derive_serve):
    """A consumer's supported_versions, as the OTel SDK encodes them, go the SQL way in one
    large request and are stored as a request per span (the Python decoder) stores them."""
    serve, tag = derive_serve, uuid.uuid4().hex[:8]
    before = serve.health()
    _sdk_send(serve, f"sdk-sql-{tag}", SDK_REPS, batched=True)
    mid = serve.health()
    assert mid["sql_decoded"] == before["sql_decoded"] + 1, "the batch went the Python way"
    assert mid["sql_declined"] == before["sql_declined"]
    _sdk_send(serve, f"sdk-py-{tag}", 1, batched=False)
    assert serve.health()["sql_decoded"] == mid["sql_decoded"]  # small: the Python decoder
    sql, py = _consumer_rows(serve, f"sdk-sql-{tag}"), _consumer_rows(serve, f"sdk-py-{tag}")
    assert sql == py
    windows = [(e, a[VERSIONS]) for _, e, a in sql if VERSIONS in a]
    assert windows == [("accept", _json(list(SDK_VERSIONS))), ("reject", _json(list(SDK_VERSIONS)))]
