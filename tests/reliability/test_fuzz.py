"""Fuzz the OTLP endpoint of a running serve, protobuf and JSON, with hypothesis.

Replayable: derandomize=True (the examples are a function of the test code), no example
database, a fixed budget (FUZZ_EXAMPLES per format; HANDOFFS_FUZZ_EXAMPLES overrides).
Each example is posted with a request timeout (no hang) and must get: 200 (its body a
valid ExportTraceServiceResponse), 400/413/415 with a body saying why (google.rpc.Status,
protobuf or JSON matching the request), or 503 with Retry-After; never a 5xx otherwise.
After each 200 serve must store the batch and stay healthy (no poison batch wedging the
writer); timestamps cover the whole fixed64 range and beyond (JSON), where values past
DateTime64(9) once wedged the writer (test_faults.py::test_span_the_store_cannot_hold...).

Pathological bodies, size rules and stalled clients: test_limits.py.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collector import semconv
from ingest.testing import request_json, request_protobuf, span_json, transition
from serve.testing import start_serve, wait_until
from tests.reliability._helpers import ACME, JS, PB, explains

FUZZ_EXAMPLES = int(os.environ.get("HANDOFFS_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a wedged serve would mislead it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INT64 = 2**63 - 1
WIRE_KEYS = [a.name for a in semconv.WIRE_ATTRIBUTES]
STATS: dict[str, dict[int, int]] = {"protobuf": {}, "json": {}}

# ------------------------------------------------------------------ strategies

text = st.text(st.characters(codec="utf-8"), max_size=40)
junk = st.recursive(
    st.none() | st.booleans() | st.integers(-INT64, INT64) | st.floats() | text,
    lambda ch: st.lists(ch, max_size=4) | st.dictionaries(text, ch, max_size=4),
    max_leaves=12,
)


def _maybe(s):
    """Mostly `s`, sometimes arbitrary JSON in its place."""
    return st.one_of(s, s, s, junk)


any_value = st.recursive(
    st.builds(lambda v: {"stringValue": v}, text)
    | st.builds(lambda v: {"intValue": str(v)}, st.integers(-INT64, INT64))
    | st.builds(lambda v: {"intValue": v}, st.integers(-INT64, INT64))
    | st.builds(lambda v: {"boolValue": v}, st.booleans())
    | st.builds(lambda v: {"doubleValue": v}, st.floats(allow_nan=False, allow_infinity=False))
    | st.builds(lambda v: {"bytesValue": base64.b64encode(v).decode()}, st.binary(max_size=20))
    | st.just({}),
    lambda ch: (
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(ch, max_size=3))
        | st.builds(
            lambda kv: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kv]}},
            st.lists(st.tuples(text, ch), max_size=3),
        )
    ),
    max_leaves=6,
)
attr_key = st.one_of(st.sampled_from(WIRE_KEYS), text)
attributes = st.lists(
    st.builds(lambda k, v: {"key": k, "value": v}, attr_key, _maybe(any_value)), max_size=8
)
hex_id = lambda n: st.one_of(  # noqa: E731
    st.binary(min_size=n, max_size=n).map(bytes.hex),
    st.binary(max_size=2 * n).map(bytes.hex),
    st.just(""),
    text,
)
nanos = st.one_of(
    st.integers(0, INT64),
    st.integers(0, 2**64 - 1).map(str),
    st.integers(2**63, 2**70),  # past fixed64: JSON only (protobuf refuses to build it)
    st.just(None),
)
span = st.fixed_dictionaries(
    {
        "traceId": _maybe(hex_id(16)),
        "spanId": _maybe(hex_id(8)),
        "name": _maybe(text),
        "kind": _maybe(st.integers(-5, 10) | st.sampled_from(["SPAN_KIND_SERVER", "BOGUS"])),
        "startTimeUnixNano": _maybe(nanos),
        "endTimeUnixNano": _maybe(nanos),
        "attributes": _maybe(attributes),
    },
    optional={
        "parentSpanId": _maybe(hex_id(8)),
        "status": _maybe(st.fixed_dictionaries({"code": st.integers(-2, 5), "message": text})),
        "events": _maybe(
            st.lists(
                st.fixed_dictionaries(
                    {"timeUnixNano": nanos, "name": text, "attributes": attributes}
                ),
                max_size=2,
            )
        ),
        "links": _maybe(
            st.lists(
                st.fixed_dictionaries(
                    {"traceId": hex_id(16), "spanId": hex_id(8), "attributes": attributes}
                ),
                max_size=2,
            )
        ),
    },
)
document = st.fixed_dictionaries(
    {
        "resourceSpans": _maybe(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "resource": _maybe(st.fixed_dictionaries({"attributes": attributes})),
                        "scopeSpans": _maybe(
                            st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "scope": _maybe(st.fixed_dictionaries({"name": text})),
                                        "spans": _maybe(st.lists(span, max_size=3)),
                                    }
                                ),
                                max_size=2,
                            )
                        ),
                    }
                ),
                max_size=2,
            )
        )
    }
)


def _handoff_span(draw_rng: random.Random, attrs: list[dict]) -> dict:
    """A well-formed span (valid ids/times) carrying the fuzzed attributes: reaches validation."""
    now = time.time_ns()
    return {
        "traceId": f"{draw_rng.getrandbits(128) | 1:032x}",
        "spanId": f"{draw_rng.getrandbits(64) | 1:016x}",
        "parentSpanId": "",
        "name": "fuzz",
        "startTimeUnixNano": str(now),
        "endTimeUnixNano": str(now + 1),
        "attributes": attrs,
    }


@st.composite
def json_body(draw) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=200))  # not JSON at all
    if kind == 1:
        return json.dumps(draw(junk)).encode()
    if kind <= 3:
        return json.dumps(draw(document)).encode()
    # valid envelope, fuzzed attributes on well-formed spans: exercises validation + storage
    rng = random.Random(draw(st.integers(0, 2**32)))
    spans = [_handoff_span(rng, draw(attributes)) for _ in range(draw(st.integers(1, 3)))]
    return json.dumps(request_json(spans), ensure_ascii=draw(st.booleans())).encode()


@st.composite
def protobuf_body(draw) -> bytes:
    rng = random.Random(draw(st.integers(0, 2**32)))
    attrs = draw(attributes)
    try:
        valid = request_protobuf([_handoff_span(rng, attrs) for _ in range(2)])
    except Exception:  # fuzzed attributes that protobuf's JSON mapping refuses: a plain span
        valid = request_protobuf([_handoff_span(rng, [])])
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        return valid[: draw(st.integers(0, max(0, len(valid) - 1)))]  # truncated
    if kind == 2:
        return valid + draw(st.binary(min_size=1, max_size=50))  # trailing junk
    if kind == 3:
        return draw(st.binary(min_size=1, max_size=50)) + valid  # leading junk
    return valid


# ------------------------------------------------------------------ checks


def _check(h, body: bytes, fmt: str, headers: dict) -> None:
    r = requests.post(f"{h.otlp_url}/v1/traces", data=body, headers=headers, timeout=30)
    stats = STATS[fmt]
    stats[r.status_code] = stats.get(r.status_code, 0) + 1
    assert r.status_code in (200, 400, 413, 415, 503), (r.status_code, r.text[:500], body[:300])
    if r.status_code == 503:
        assert r.headers.get("Retry-After")
    elif r.status_code != 200:
        explains(r, fmt)
    elif fmt == "protobuf":
        ExportTraceServiceResponse.FromString(r.content)
    else:
        assert isinstance(r.json(), dict)
    if r.status_code == 200:
        # the writer stores it (or the store rejects it and serve says so) — never wedges
        health = wait_until(
            lambda: (hh := h.health()) and hh["queued"] == 0 and hh,
            30,
            "serve to store the batch",
        )
        assert health["status"] == "ok", (health, body[:500])


@pytest.fixture(scope="module")
def fuzz_serve(tmp_path_factory):
    h = start_serve(tmp_path_factory.mktemp("fuzz"), "tok-acme=acme")
    yield h
    print(f"FIGURES fuzz statuses: {STATS}; serve health at end {h.health()}")
    code = h.stop()
    assert code == 0, h.log()[-2000:]


@FUZZ
@given(body=protobuf_body())
def test_fuzz_protobuf(fuzz_serve, body):
    _check(fuzz_serve, body, "protobuf", {**PB, **ACME})


@FUZZ
@given(body=json_body())
def test_fuzz_json(fuzz_serve, body):
    _check(fuzz_serve, body, "json", {**JS, **ACME})


def test_serve_survives_the_fuzz_and_still_ingests(fuzz_serve):
    h = fuzz_serve
    assert h.process.poll() is None, h.log()[-2000:]
    body = request_protobuf(
        [
            span_json(
                trace_id="f0" * 16,
                span_id="f0" * 8,
                attributes=transition("after-fuzz", "create", "", "created"),
                start_ns=time.time_ns(),
            )
        ]
    )
    assert (
        requests.post(
            f"{h.otlp_url}/v1/traces", data=body, headers={**PB, **ACME}, timeout=30
        ).status_code
        == 200
    )
    h.wait_stored(60)
    c = h.client()
    try:
        n = c.query("SELECT count() FROM handoff_transitions WHERE handoff_id = 'after-fuzz'")
        assert n.result_rows == [(1,)]
    finally:
        c.close()
