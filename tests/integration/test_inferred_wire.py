"""What senders do without declaring it, through the shim (`HandoffTracer`), the real OTel
SDK and OTLP/HTTP exporter into a real `handoffs serve`, read with analytics.anomalies:
each inferred or extended kind on a hand-computed fixture with its near misses, exact ids.

Sender `billing` (its own tracer), receiver `payments` (another). Window [t0, t0 + 1 h),
as_of t0 + 2 h; times are seconds after t0. Each case has its own task and objective, so
no two cases share a payload hash or an inferred retry link. Default settings: the keyless
window is 600 s, grants are not required (HANDOFFS_REQUIRE_GRANTS=0) unless a test says so.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from analytics import Window, anomalies, keyless_writes
from analytics.oracle.inferred import INFERRED_KINDS
from collector import Envelope, Grant, HandoffTracer
from collector.tracer import Handoff

S = 10**9
HOUR = 3600 * S
#: recent (the tables' TTL drops old months), a whole hour at least 3 h ago
T0 = (time.time_ns() // HOUR - 3) * HOUR
KINDS = ("blind_retry", *INFERRED_KINDS)
EV: dict[str, Any] = {"evidence_count": 1, "evidence_valid": True, "evidence_refs": ["r:1"]}


def at(sec: float) -> int:
    return T0 + int(sec * S)


def _env(h: str, task: str, objective: str, **kw: Any) -> Envelope:
    kw.setdefault("to_agent", "payments")
    return Envelope(task_id=task, handoff_id=h, from_agent="billing", mode="delegate",
                    objective=objective, **kw)  # fmt: skip


def _done(payments: HandoffTracer, h: Handoff, sec: float, **accept: Any) -> None:
    r = payments.receive(h.to_wire())
    r.accept(at(sec), **accept)
    r.start(at(sec + 1))
    r.commit(at(sec + 2), **EV)


def _refuse(payments: HandoffTracer, h: Handoff, sec: float, code: str) -> None:
    payments.receive(h.to_wire()).reject(at(sec), error_code=code)


def emit(billing: HandoffTracer, payments: HandoffTracer) -> None:
    # -- blind_retry inferred: u2 (a new id and key, same task, agents and objective, while
    # u1 is unknown: timed out at 30, never resolved). Not: n2 (the same while n1 is unknown,
    # another objective), f2 (f1's unknown was resolved failed at 40, before f2 at 50)
    u1 = billing.create(_env("u1", "t-u", "refund 10 EUR", idempotency_key="ku-1"), at(0))
    u1.timeout(at(30), error_code="timeout")
    _done(payments, billing.create(_env("u2", "t-u", "refund 10 EUR", idempotency_key="ku-2"),
                                   at(60)), 61)  # fmt: skip
    n1 = billing.create(_env("n1", "t-n", "refund 11 EUR", idempotency_key="kn-1"), at(0))
    n1.timeout(at(30), error_code="timeout")
    _done(payments, billing.create(_env("n2", "t-n", "refund 12 EUR", idempotency_key="kn-2"),
                                   at(60)), 61)  # fmt: skip
    f1 = billing.create(_env("f1", "t-f", "refund 13 EUR", idempotency_key="kf-1"), at(0))
    f1.timeout(at(30), error_code="timeout")
    f1.resolve_failed(at(40), error_code="not_received")
    _done(payments, billing.create(_env("f2", "t-f", "refund 13 EUR", idempotency_key="kf-2"),
                                   at(50)), 51)  # fmt: skip
    # -- retry_after_final_refusal: p2 (retry_of p1 after p1's permission_denied), p3 (no
    # retry_of, same task, agents and objective). Not: b2 (retry_of b1 after a `busy`), o2
    # (p-task, another objective), x2 (created at 10, when x1 was refused only at 20)
    p1 = billing.create(_env("p1", "t-p", "refund 20 EUR", idempotency_key="kp"), at(0))
    _refuse(payments, p1, 1, "permission_denied")
    _refuse(payments, billing.retry(p1, "p2", at(5)), 6, "permission_denied")
    _refuse(payments, billing.create(_env("p3", "t-p", "refund 20 EUR"), at(9)), 10,
            "permission_denied")  # fmt: skip
    b1 = billing.create(_env("b1", "t-b", "refund 21 EUR", idempotency_key="kb"), at(0))
    _refuse(payments, b1, 1, "busy")
    _done(payments, billing.retry(b1, "b2", at(5)), 6)
    _done(payments, billing.create(_env("o2", "t-p", "refund 22 EUR"), at(12)), 13)
    x1 = billing.create(_env("x1", "t-x", "refund 23 EUR"), at(0))
    x2 = billing.create(_env("x2", "t-x", "refund 23 EUR"), at(10))
    _refuse(payments, x1, 20, "unknown_capability")
    _done(payments, x2, 21)
    # -- keyless_duplicate_write: q2 (q1's payload to the same queue consumer, no key, 60 s
    # later, both committed), c2 (a command sent twice in process). Not: q3 (another
    # payload), k2 (keyed), e2 (an event, not a command), l2 (601 s after l1)
    queue = {"topology": "shared_queue"}
    kw: dict[str, Any]
    for h, sec, obj, kw in (
        ("q1", 100, "credit account 7", queue),
        ("q2", 160, "credit account 7", queue),
        ("q3", 170, "credit account 8", queue),
        ("k1", 100, "credit account 9", {**queue, "idempotency_key": "kk-1"}),
        ("k2", 160, "credit account 9", {**queue, "idempotency_key": "kk-2"}),
        ("c1", 100, "close order 5", {"message_kind": "command"}),
        ("c2", 130, "close order 5", {"message_kind": "command"}),
        ("e1", 100, "order 6 closed", {"message_kind": "event"}),
        ("e2", 130, "order 6 closed", {"message_kind": "event"}),
        ("l1", 100, "credit account 10", queue),
        ("l2", 701, "credit account 10", queue),
    ):
        _done(payments, billing.create(_env(h, f"t-{h}", obj, **kw), at(sec)), sec + 1)
    # -- grant_caller_mismatch: g1 (the grant names mallory as its caller). Not: g2 (its
    # caller is the sender); missing_grant, when grants are required: m1 (asks for
    # `refund`, no grant at all). Not: m2 (a grant with a subject only), m3 (no capability)
    for h, kw in (
        ("g1", {"grant": Grant(caller="mallory", capabilities=("refund",))}),
        ("g2", {"grant": Grant(caller="billing", capabilities=("refund",))}),
        ("m1", {"capabilities": ("refund",)}),
        ("m2", {"capabilities": ("refund",), "grant": Grant(subject="user:7")}),
        ("m3", {}),
    ):
        _done(payments, billing.create(_env(h, f"t-{h}", f"refund for {h}", **kw), at(200)), 201)
    # -- out_of_order_version: v2 (its envelope carries v8 after the task saw v10), v3 (its
    # receiver's accept carries v7). Not: v1 (v10 first), v4 (v10 again), w1 (v8 in another
    # task)
    _done(payments, billing.create(_env("v1", "t-v", "ledger v1", state_version=10), at(300)),
          301, state_version=10)  # fmt: skip
    _done(payments, billing.create(_env("v2", "t-v", "ledger v2", state_version=8), at(310)), 311)
    _done(payments, billing.create(_env("v3", "t-v", "ledger v3", state_version=10), at(320)),
          321, state_version=7)  # fmt: skip
    _done(payments, billing.create(_env("v4", "t-v", "ledger v4", state_version=10), at(330)), 331)
    _done(payments, billing.create(_env("w1", "t-w", "ledger w1", state_version=8), at(340)), 341)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("inferred-wire"))
    provider = TracerProvider(resource=Resource.create({"service.name": "inferred"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{s.otlp_url}/v1/traces")))
    emit(HandoffTracer("billing", tracer_provider=provider),
         HandoffTracer("payments", tracer_provider=provider))  # fmt: skip
    provider.force_flush()
    provider.shutdown()
    s.wait_stored()
    yield s
    s.stop()


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


WINDOW = Window(start=datetime.fromtimestamp(T0 / S, UTC),
                end=datetime.fromtimestamp((T0 + HOUR) / S, UTC),
                as_of=datetime.fromtimestamp((T0 + 2 * HOUR) / S, UTC))  # fmt: skip


def _flagged(serve) -> dict[str, list[str]]:
    with serve.client() as c:
        df = anomalies(c, database=serve.database, window=WINDOW, kinds=KINDS, examples=50)
    return {r.kind: sorted(r.examples) for r in df.itertuples() if r.count}


def test_each_kind_flags_its_cases_and_no_near_miss(serve, monkeypatch):
    monkeypatch.delenv("HANDOFFS_REQUIRE_GRANTS", raising=False)
    assert _flagged(serve) == {
        "blind_retry": ["u2"],
        "retry_after_final_refusal": ["p2", "p3"],
        "keyless_duplicate_write": ["c2", "q2"],
        "grant_caller_mismatch": ["g1"],
        "out_of_order_version": ["v2", "v3"],
    }


def test_missing_grant_only_where_the_policy_requires_grants(serve, monkeypatch):
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")
    got = _flagged(serve)
    # every other case asks for no capability: m1 alone
    assert got["missing_grant"] == ["m1"]
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "0")
    assert "missing_grant" not in _flagged(serve)


def test_keyless_share_per_pair_in_the_api_and_the_cli(serve, monkeypatch, capsys):
    """billing -> payments: 9 side-effecting handoffs (q1-q3, l1, l2, k1, k2 on the queue; c1,
    c2 commands; e1, e2 are events), 7 of them keyless, 2 flagged duplicates (q2, c2)."""
    want = {"from_agent": "billing", "to_agent": "payments", "side_effecting": 9, "keyless": 7,
            "keyless_share": pytest.approx(7 / 9), "duplicates": 2}  # fmt: skip
    with serve.client() as c:
        df = keyless_writes(c, WINDOW, database=serve.database)
    assert df.to_dict(orient="records") == [want]
    from handoffs.cli import main

    monkeypatch.setenv("HANDOFFS_PASSWORD", serve.query_token or "")
    code = main(["keyless", "--store", serve.query_url, "--database", serve.database, "--json",
                 "--from", _iso(T0), "--to", _iso(T0 + HOUR), "--as-of", _iso(T0 + 2 * HOUR)])  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out) == [want]
