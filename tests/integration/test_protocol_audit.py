"""The protocol audit on a hand-computed fixture sent through the real OTel SDK and OTLP/HTTP
exporter into a real `handoffs serve`: each kind with its positive and near-miss cases, exact
ids; p_verify; `handoffs rejections`.

Tenant `acme` is the credential's. Window [t0, t0+1h), as_of t0+2h: every handoff is settled
(default 300 s deadline + 60 s grace). Times are seconds after t0. Receiver events are
emitted by the to_agent `worker` unless a case says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from analytics import Window, anomalies, anomaly_handoff_ids, funnel
from analytics.oracle.audit import AUDIT_KINDS
from analytics.rejections import rejections
from collector import semconv as sc
from serve.testing import ServeHandle, start_serve

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))
TOKEN = "tok-acme"
EV = {sc.EVIDENCE_COUNT: 1, sc.EVIDENCE_VALID: True}


def iso(sec: float) -> str:
    return (T0 + timedelta(seconds=sec)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Emitter:
    """One span per transition with the wire attributes set by hand (no shim)."""

    def __init__(self, serve: ServeHandle) -> None:
        exporter = OTLPSpanExporter(
            f"{serve.otlp_url}/v1/traces", headers={"authorization": f"Bearer {TOKEN}"}
        )
        self.provider = TracerProvider(resource=Resource.create({"service.name": "audit"}))
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("protocol-audit-fixture")
        self.task: dict[str, str] = {}

    def span(self, h: str, event: str, frm: str, to: str, sec: float, actor: str, **attrs: Any):
        ns = int((T0 + timedelta(seconds=sec)).timestamp() * 1e9)
        a = {sc.TASK_ID: self.task[h], sc.HANDOFF_ID: h, sc.EVENT: event, sc.FROM_STATE: frm,
             sc.TO_STATE: to, sc.ACTOR: actor, **attrs}  # fmt: skip
        self.tracer.start_span(f"handoff.{event}", start_time=ns, attributes=a).end(end_time=ns)

    def create(self, h: str, sec: float, *, task: str, to_agent: str = "worker", **attrs: Any):
        self.task[h] = task
        env = {sc.PROTOCOL: "aa-handoff/v1", sc.MODE: "delegate", sc.FROM_AGENT: "planner",
               sc.TO_AGENT: to_agent, **attrs}  # fmt: skip
        self.span(h, "create", "", "created", sec, "planner", **env)

    def run(self, h: str, sec: float, by: str = "worker") -> None:
        """accept at sec, start at sec + 1."""
        self.span(h, "accept", "created", "accepted", sec, by)
        self.span(h, "start", "accepted", "running", sec + 1, by)

    def commit(self, h: str, sec: float, frm: str = "running", **attrs: Any) -> None:
        self.span(h, "commit", frm, "committed", sec, "worker", **EV, **attrs)

    def timeout(self, h: str, sec: float) -> None:
        self.span(h, "timeout", "running", "unknown", sec, "planner")


def fixture_spans(e: Emitter) -> None:
    slot: dict[str, Any] = {sc.IDEMPOTENCY_KEY: "kr"}
    # -- blind_retry: r2 (retry_of r1, while r1 unknown, never resolved) and u2 (same task,
    # target and key while u1 unknown; u1 resolved failed only later). Not: f2 (after
    # f1's resolve_failed), c2 (after c1's resolve_committed), x2 (before x1 went unknown),
    # y2 (same task and key, another target)
    e.create("r1", 0, task="tr", **slot)
    e.run("r1", 1)
    e.timeout("r1", 3)
    retry: dict[str, Any] = {sc.RETRY_OF: "r1", sc.ATTEMPT: 2}
    e.create("r2", 10, task="tr", **slot, **retry)
    e.run("r2", 11)
    e.span("r2", "fail", "running", "failed", 13, "worker", **{sc.ERROR_CODE: "busy"})
    e.create("y2", 10, task="tr", to_agent="coder", **slot)
    e.span("y2", "cancel", "created", "canceled", 11, "planner")
    e.create("u1", 0, task="tu", **{sc.IDEMPOTENCY_KEY: "ku"})
    e.run("u1", 1)
    e.timeout("u1", 3)
    e.span("u1", "resolve_failed", "unknown", "failed", 20, "planner")
    again: dict[str, Any] = {sc.IDEMPOTENCY_KEY: "ku", sc.ATTEMPT: 2}
    e.create("u2", 10, task="tu", **again)
    e.span("u2", "cancel", "created", "canceled", 11, "planner")
    e.create("f1", 0, task="tf", **{sc.IDEMPOTENCY_KEY: "kf"})
    e.run("f1", 1)
    e.timeout("f1", 3)
    e.span("f1", "resolve_failed", "unknown", "failed", 5, "planner")
    e.create("f2", 10, task="tf", **{sc.IDEMPOTENCY_KEY: "kf", sc.RETRY_OF: "f1"})
    e.run("f2", 11)
    e.commit("f2", 13)
    e.create("x1", 0, task="tx", **{sc.IDEMPOTENCY_KEY: "kx"})
    e.span("x1", "timeout", "created", "unknown", 30, "planner")
    e.span("x1", "resolve_failed", "unknown", "failed", 40, "planner")
    e.create("x2", 10, task="tx", **{sc.IDEMPOTENCY_KEY: "kx"})
    e.span("x2", "cancel", "created", "canceled", 11, "planner")
    # -- duplicate_execution: c2 (c1 resolved committed at 5, c2 commits at 13, same key)
    # and e2 (e1 committed at 3, e2 at 13: same key, other task). Not: c1 and e1 (first to
    # commit), d2 (d1 failed: a retry after a confirmed failure), f2 (f1 failed)
    e.create("c1", 0, task="tc", **{sc.IDEMPOTENCY_KEY: "kc"})
    e.run("c1", 1)
    e.timeout("c1", 3)
    e.span("c1", "resolve_committed", "unknown", "committed", 5, "planner", **EV)
    e.create("c2", 10, task="tc", **{sc.IDEMPOTENCY_KEY: "kc", sc.RETRY_OF: "c1"})
    e.run("c2", 11)
    e.commit("c2", 13)
    e.create("d1", 0, task="td1", **{sc.IDEMPOTENCY_KEY: "kd"})
    e.run("d1", 1)
    e.span("d1", "fail", "running", "failed", 3, "worker", **{sc.ERROR_CODE: "conflict"})
    e.create("d2", 10, task="td2", **{sc.IDEMPOTENCY_KEY: "kd"})
    e.run("d2", 11)
    e.commit("d2", 13)
    e.create("e1", 0, task="te1", **{sc.IDEMPOTENCY_KEY: "ke"})
    e.run("e1", 1)
    e.commit("e1", 3)
    e.create("e2", 10, task="te2", **{sc.IDEMPOTENCY_KEY: "ke"})
    e.run("e2", 11)
    e.commit("e2", 13)
    # -- consumed_before_verified: v3 (before v1's verify at 5), w2 (w1 never verified);
    # expired_receipt_used: v4 (after v1's receipt expired at 100). Not: v2 (after the
    # verify, receipt valid), v5 (its causation_id names no handoff)
    e.create("v1", 0, task="tv")
    e.run("v1", 1)
    e.commit("v1", 3, **{sc.RECEIPT_ID: "rcpt-v1", sc.RECEIPT_EXPIRES_AT: iso(100)})
    e.span("v1", "verify", "committed", "verified", 5, "planner", **{sc.RECEIPT_READ_BACK: True})
    for h, at in (("v2", 10), ("v3", 4), ("v4", 200)):
        e.create(h, at, task=f"t{h}", **{sc.CAUSATION_ID: "v1"})
        e.span(h, "cancel", "created", "canceled", at + 1, "planner")
    e.create("v5", 10, task="tv5", **{sc.CAUSATION_ID: "msg-42"})
    e.span("v5", "cancel", "created", "canceled", 11, "planner")
    e.create("w1", 0, task="tw")
    e.run("w1", 1)
    e.commit("w1", 3, **{sc.RECEIPT_ID: "rcpt-w1", sc.RECEIPT_EXPIRES_AT: iso(3000)})
    e.create("w2", 10, task="tw2", **{sc.CAUSATION_ID: "w1"})
    e.span("w2", "cancel", "created", "canceled", 11, "planner")
    # -- wrong_consumer: g1 (accepted by another agent). Not: g2 (the sender cancels: not
    # a receiver event)
    e.create("g1", 0, task="tg1")
    e.span("g1", "accept", "created", "accepted", 1, "intruder")
    e.span("g1", "cancel", "accepted", "canceled", 2, "planner")
    e.create("g2", 0, task="tg2")
    e.span("g2", "accept", "created", "accepted", 1, "worker")
    e.span("g2", "cancel", "accepted", "canceled", 2, "planner")

    # -- grants. grant_expired: k1 (commit at 3 after expiry at 2.5). Not: k2 (expires
    # after the commit), k3 (expired before its accept, but never started).
    # capability_outside_grant: k4 (deploy not granted). Not: k1 (a subset), k5 (no grant).
    # grant_tenant_mismatch: k6 (issued for globex). Not: k1..k5 (acme or none)
    def grant(expires: float, caps: list[str], tenant: str = "acme") -> dict[str, Any]:
        return {sc.GRANT_CAPABILITIES: caps, sc.GRANT_TENANT: tenant, sc.GRANT_CALLER: "planner",
                sc.GRANT_SUBJECT: "user-1", sc.GRANT_EXPIRES_AT: iso(expires)}  # fmt: skip

    for h, g, caps in (
        ("k1", grant(2.5, ["search", "write"]), ["search"]),
        ("k2", grant(10, ["search"]), ["search"]),
        ("k4", grant(1000, ["search"]), ["search", "deploy"]),
        ("k5", {}, ["deploy"]),
        ("k6", grant(1000, ["search"], "globex"), ["search"]),
    ):
        asks: dict[str, Any] = {sc.CAPABILITIES: caps}
        e.create(h, 0, task=f"t{h}", **asks, **g)
        e.run(h, 1)
        e.commit(h, 3)
    e.create("k3", 0, task="tk3", **grant(0.5, []))
    e.span("k3", "accept", "created", "accepted", 1, "worker")
    e.span("k3", "cancel", "accepted", "canceled", 2, "planner")
    # -- tenant_claim_mismatch: m1 claims globex. Not: m2 (claims acme, its own)
    e.create("m1", 0, task="tm1", **{sc.TENANT: "globex"})
    e.span("m1", "cancel", "created", "canceled", 1, "planner")
    e.create("m2", 0, task="tm2", **{sc.TENANT: "acme"})
    e.span("m2", "cancel", "created", "canceled", 1, "planner")
    # -- rejections: j1 j2 busy, j3 grant_expired, j4 a code outside the vocabulary, j5 none
    for h, code in (("j1", "busy"), ("j2", "busy"), ("j3", "grant_expired"), ("j4", "teapot"),
                    ("j5", None)):  # fmt: skip
        e.create(h, 0, task=f"t{h}")
        e.span(h, "reject", "created", "rejected", 1, "worker",
               **({sc.ERROR_CODE: code} if code else {}))  # fmt: skip


# every handoff above, all settled: r1 r2 y2 u1 u2 f1 f2 x1 x2 (9) c1 c2 d1 d2 e1 e2 (15) v1..v5
# (20) w1 w2 g1 g2 (24) k1..k6 (30) m1 m2 j1..j5 (37)
SETTLED = 37
EXPECTED = {
    "blind_retry": ["r2", "u2"],
    "duplicate_execution": ["c2", "e2"],
    "consumed_before_verified": ["v3", "w2"],
    "expired_receipt_used": ["v4"],
    "wrong_consumer": ["g1"],
    "grant_expired": ["k1"],
    "capability_outside_grant": ["k4"],
    "grant_tenant_mismatch": ["k6"],
    "tenant_claim_mismatch": ["m1"],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[ServeHandle]:
    serve = start_serve(tmp_path_factory.mktemp("audit"), f"{TOKEN}=acme")
    try:
        e = Emitter(serve)
        fixture_spans(e)
        e.provider.shutdown()
        serve.wait_stored()
        yield serve
    finally:
        serve.stop()


def test_each_kind_flags_exactly_the_hand_computed_handoffs(served):
    client = served.client()
    assert set(EXPECTED) == set(AUDIT_KINDS)
    df = anomalies(client, database=served.database, window=WINDOW, tenant="acme", examples=10)
    got = {r.kind: (r.count, list(r.examples)) for r in df.itertuples() if r.kind in AUDIT_KINDS}
    assert got == {k: (len(v), v) for k, v in EXPECTED.items()}
    for kind, ids in EXPECTED.items():
        assert (
            anomaly_handoff_ids(client, database=served.database, window=WINDOW, kind=kind) == ids
        )


def test_p_verify_and_the_cli(served, capsys):
    from handoffs.cli import main

    row = funnel(served.client(), database=served.database, window=WINDOW).iloc[0]
    assert row["settled"] == SETTLED
    # K: f2 c1 c2 d2 e1 e2 v1 w1 k1 k2 k4 k5 k6 (r1 u1 x1 never committed); verified: v1
    assert (row["committed"], row["verified"]) == (13, 1)
    assert row["p_verify"] == pytest.approx(1 / 13)
    store = ["--store", f"http://127.0.0.1:{served.query_port}", "--database", served.database]
    win = ["--from", "2026-11-23T10:00:00Z", "--to", "2026-11-23T11:00:00Z",
           "--as-of", "2026-11-23T12:00:00Z"]  # fmt: skip
    assert main(["metrics", *win, *store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["verified"], doc["p_verify"]) == (1, pytest.approx(1 / 13))
    assert main(["anomalies", *win, *store, "--json", "--examples", "5"]) == 0
    kinds = {r["kind"]: r for r in json.loads(capsys.readouterr().out)}
    assert {k: kinds[k]["examples"] for k in EXPECTED} == EXPECTED
    assert main(["rejections", *win, *store, "--json"]) == 0
    rej = json.loads(capsys.readouterr().out)
    assert [(r["error_code"], r["count"], r["examples"]) for r in rej] == [
        ("busy", 2, ["j1", "j2"]),
        ("other", 2, ["j4", "j5"]),
        ("grant_expired", 1, ["j3"]),
    ]
    assert rej[1]["raw_codes"] == ["", "teapot"]
    assert rej[0]["share_of_rejections"] == pytest.approx(2 / 5)
    assert rej[0]["share_of_settled"] == pytest.approx(2 / SETTLED)
    assert main(["rejections", *win, *store]) == 0
    human = capsys.readouterr().out
    assert "other ((empty), teapot)" in human and "busy" in human
    with pytest.raises(SystemExit) as bad:  # argparse refuses an unknown dimension
        main(["rejections", *win, *store, "--by", "colour"])
    assert bad.value.code == 2


def test_rejections_api_by_dimension(served):
    got = rejections(
        served.client(), database=served.database, window=WINDOW, tenant="acme", by="to_agent"
    )
    assert {(r.group, r.error_code, r.count) for r in got} == {
        ("worker", "busy", 2),
        ("worker", "other", 2),
        ("worker", "grant_expired", 1),
    }
    # the worker group's settled handoffs: all but y2 (to coder)
    assert got[0].share_of_settled == pytest.approx(2 / (SETTLED - 1))
    assert rejections(served.client(), database=served.database, window=WINDOW, tenant="x") == []
