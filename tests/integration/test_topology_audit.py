"""Each topology's own anomaly kinds and tables on a hand-computed fixture sent through the
real OTel SDK and OTLP/HTTP exporter into a real `handoffs serve`: each kind with its
positive and near-miss cases, exact ids; the lag, fan-out, unknown-field and per-topology
tables; the schema_version and message_kind slices; `handoffs metrics` and `anomalies`.

Tenant `acme`, window [t0, t0+1h), as_of t0+2h (the emitter and window of test_protocol_audit.py).
Times are seconds after t0; receiver events come from the to_agent `worker` unless a case
says otherwise. Thresholds are the defaults: lag > 60,000 ms or > 1,000 offsets, Agent Card
older than 24 h, risky fields grant.*, tenant, amount*, permission*, resource_version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from analytics import (
    Window,
    anomalies,
    funnel,
    queue_lag,
    task_fan_out,
    topology_cards,
    unknown_fields,
)
from analytics._sql.topology import Thresholds, thresholds
from analytics.oracle.topology import TOPOLOGY_KINDS
from collector import semconv as sc
from serve.testing import ServeHandle, start_serve
from tests.integration.test_protocol_audit import EV, TOKEN, WINDOW, Emitter, iso

H = 3600.0
BAD_EV = {sc.EVIDENCE_COUNT: 1, sc.EVIDENCE_VALID: False}


def _items(expected: int, returned: int) -> dict:
    return {sc.RESULT_ITEMS_EXPECTED: expected, sc.RESULT_ITEMS_RETURNED: returned}


def fixture_spans(e: Emitter) -> None:
    topo = sc.TOPOLOGY
    # -- consumer_lag: q1 (lag 60,001 ms), q3 (1,001 offsets behind). Not: q2 (60,000 ms and
    # 1,000 offsets: at the thresholds), q4 (a lag on a reject, not a consumer's accept), q5
    for h, attrs in (
        ("q1", {sc.QUEUE_LAG_MS: 60_001, sc.QUEUE_OFFSET: 1, sc.QUEUE_HEAD_OFFSET: 2}),
        ("q2", {sc.QUEUE_LAG_MS: 60_000, sc.QUEUE_OFFSET: 5, sc.QUEUE_HEAD_OFFSET: 1005}),
        ("q3", {sc.QUEUE_LAG_MS: 10, sc.QUEUE_OFFSET: 10, sc.QUEUE_HEAD_OFFSET: 1011}),
    ):
        e.create(h, 0, task=f"t{h}", **{topo: "shared_queue"})
        e.span(h, "accept", "created", "accepted", 1, "worker", **{sc.QUEUE_NAME: "jobs"}, **attrs)
    e.create("q4", 0, task="tq4", **{topo: "shared_queue"})
    e.span("q4", "reject", "created", "rejected", 1, "worker", **{sc.QUEUE_LAG_MS: 99_999})
    e.create("q5", 0, task="tq5", to_agent="worker2", **{topo: "shared_queue"})
    e.span("q5", "accept", "created", "accepted", 1, "worker2",
           **{sc.QUEUE_NAME: "mail", sc.QUEUE_LAG_MS: 500})  # fmt: skip
    # -- partial_result_committed: p1 (2 of 3 items, evidence valid). Not: p2 (3 of 3), p3
    # (1 of 3 prepared, then failed: never committed), p4 (2 of 3, evidence not valid)
    aat = {topo: "agent_as_tool"}
    for h, frm, result, ev in (
        ("p1", "running", _items(3, 2), EV),
        ("p2", "running", _items(3, 3), EV),
        ("p4", "running", _items(3, 2), BAD_EV),
    ):
        e.create(h, 0, task=f"t{h}", **aat)
        e.run(h, 1)
        e.span(h, "commit", frm, "committed", 3, "worker", **ev, **result)
    e.create("p3", 0, task="tp3", **aat)
    e.run("p3", 1)
    e.span("p3", "prepare", "running", "prepared", 3, "worker", **EV, **_items(3, 1))
    e.span("p3", "fail", "prepared", "failed", 4, "worker")
    # -- fan_out_all: fa1..fa4 (orch's task tf1 calls e1, e2, e3 -- every expert orch
    # called -- e1 twice). Not: fb1, fb2 (tf2: 2 experts), fc1..fc4 (orch2's tg1 calls 3
    # experts, but orch2 also called e4 in tg2)
    for h, task, orch, expert in (
        ("fa1", "tf1", "orch", "e1"), ("fa2", "tf1", "orch", "e2"), ("fa3", "tf1", "orch", "e3"),
        ("fa4", "tf1", "orch", "e1"), ("fb1", "tf2", "orch", "e1"), ("fb2", "tf2", "orch", "e2"),
        ("fc1", "tg1", "orch2", "e1"), ("fc2", "tg1", "orch2", "e2"), ("fc3", "tg1", "orch2", "e3"),
        ("fc4", "tg2", "orch2", "e4"),
    ):  # fmt: skip
        e.create(h, 0, task=task, to_agent=expert, **{sc.FROM_AGENT: orch}, **aat)
    # -- unfiltered_sensitive_history: s1 (2 found, 1 removed), s3 (1 found, none recorded
    # removed). Not: s2 (2 and 2), s4 (not a transfer)
    for h, mode, sens, removed in (
        ("s1", "transfer", 2, 1),
        ("s2", "transfer", 2, 2),
        ("s3", "transfer", 1, None),
        ("s4", "delegate", 3, 0),
    ):
        hist: dict[str, Any] = {
            topo: "in_process",
            sc.MODE: mode,
            sc.HISTORY_ITEMS: 6,
            sc.HISTORY_SENSITIVE_ITEMS: sens,
            sc.INPUT_FILTER: "pii",
        }
        if removed is not None:
            hist[sc.HISTORY_REMOVED_ITEMS] = removed
        e.create(h, 0, task=f"t{h}", **hist)
    # -- stale_agent_card: a1 (card fetched 25 h before, rejected unknown_capability), a4
    # (asks for `translate`, the card lists `search`). Not: a2 (fetched 23 h before), a3
    # (25 h, but rejected busy), a5 (its capability is on the card); a6 (no card) sends a
    # message after its terminal state: invalid_transition
    fed = {topo: "federated_a2a", sc.AGENT_CARD_URL: "https://w.example/.well-known/agent.json"}
    for h, age_h, code in (("a1", 25, "unknown_capability"), ("a2", 23, "unknown_capability"),
                           ("a3", 25, "busy")):  # fmt: skip
        e.create(h, 0, task=f"t{h}", **fed, **{sc.AGENT_CARD_FETCHED_AT: iso(-age_h * H)})
        e.span(h, "reject", "created", "rejected", 1, "worker", **{sc.ERROR_CODE: code})
    for h, caps in (("a4", ["translate"]), ("a5", ["search"])):
        card: dict[str, Any] = {sc.CAPABILITIES: caps, sc.AGENT_CARD_SKILLS: ["search", "write"],
                                sc.AGENT_CARD_FETCHED_AT: iso(-60)}  # fmt: skip
        e.create(h, 0, task=f"t{h}", **fed, **card)
        e.run(h, 1)
    e.create("a6", 0, task="ta6", **{topo: "federated_a2a"})
    e.span("a6", "reject", "created", "rejected", 1, "worker", **{sc.ERROR_CODE: "busy"})
    e.span("a6", "accept", "created", "accepted", 5, "worker")
    # -- command_replayed: r1 (a command started again during a replay). Not: r2 (an event),
    # r3 (only its accept replayed), r4 (not replayed)
    replay = {sc.REPLAY: True}
    for h, kind, on_accept, on_start in (("r1", "command", False, True), ("r2", "event", True, True),
                                         ("r3", "command", True, False), ("r4", "command", False, False)):  # fmt: skip
        e.create(h, 0, task=f"t{h}", **{sc.MESSAGE_KIND: kind})
        e.span(h, "accept", "created", "accepted", 1, "worker", **(replay if on_accept else {}))
        e.span(h, "start", "accepted", "running", 2, "worker", **(replay if on_start else {}))
    # -- incompatible_accepted: i1 (v3 accepted by a consumer of 1 and 2). Not: i2 (v2), i3
    # (v3 rejected). risky_field_ignored: i4 (grant.scope ignored), i5 (handoff.amount_usd).
    # Not: i6 (tenant_hint, colour), i7 (permission.level, but rejected)
    sup = {sc.CONSUMER_SUPPORTED_VERSIONS: [1, 2]}
    for h, version, event, fields in (
        ("i1", 3, "accept", None), ("i2", 2, "accept", None), ("i3", 3, "reject", None),
        ("i4", 2, "accept", ["grant.scope", "color"]), ("i5", 2, "accept", ["handoff.amount_usd"]),
        ("i6", None, "accept", ["tenant_hint", "colour"]), ("i7", 3, "reject", ["permission.level"]),
    ):  # fmt: skip
        declared: dict[str, Any] = {sc.SCHEMA_VERSION: version} if version else {}
        e.create(h, 0, task=f"t{h}", **declared)
        extra = {sc.ENVELOPE_UNKNOWN_FIELDS: fields} if fields else {}
        to = "accepted" if event == "accept" else "rejected"
        e.span(h, event, "created", to, 1, "worker", **sup, **extra)


EXPECTED = {
    "consumer_lag": ["q1", "q3"],
    "partial_result_committed": ["p1"],
    "unfiltered_sensitive_history": ["s1", "s3"],
    "stale_agent_card": ["a1", "a4"],
    "card_skill_refused": [],  # a2's card lists no skills; a5 was not refused
    "command_replayed": ["r1"],
    "incompatible_accepted": ["i1"],
    "risky_field_ignored": ["i4", "i5"],
    "fan_out_all": ["fa1", "fa2", "fa3", "fa4"],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[ServeHandle]:
    serve = start_serve(tmp_path_factory.mktemp("topology"), f"{TOKEN}=acme")
    try:
        e = Emitter(serve)
        fixture_spans(e)
        e.provider.shutdown()
        serve.wait_stored()
        yield serve
    finally:
        serve.stop()


def test_each_kind_flags_exactly_the_hand_computed_handoffs(served):
    assert set(EXPECTED) == set(TOPOLOGY_KINDS)
    df = anomalies(served.client(), database=served.database, window=WINDOW, tenant="acme",
                   examples=10, kinds=TOPOLOGY_KINDS)  # fmt: skip
    got = {r.kind: (r.count, list(r.examples)) for r in df.itertuples()}
    assert got == {k: (len(v), v) for k, v in EXPECTED.items()}


def test_thresholds_are_settings(served, monkeypatch):
    client, db = served.client(), served.database
    monkeypatch.setenv("HANDOFFS_CONSUMER_LAG_MS", "400")
    monkeypatch.setenv("HANDOFFS_RISKY_FIELDS", "colo*")
    monkeypatch.setenv("HANDOFFS_AGENT_CARD_MAX_AGE_S", str(30 * 3600))
    kinds = ("consumer_lag", "risky_field_ignored", "stale_agent_card")
    df = anomalies(client, database=db, window=WINDOW, examples=10, kinds=kinds)
    assert {r.kind: list(r.examples) for r in df.itertuples()} == {
        "consumer_lag": ["q1", "q2", "q3", "q5"],
        "risky_field_ignored": ["i4", "i6"],
        "stale_agent_card": ["a4"],
    }
    monkeypatch.setenv("HANDOFFS_CONSUMER_LAG_OFFSETS", "many")
    with pytest.raises(ValueError, match="HANDOFFS_CONSUMER_LAG_OFFSETS"):
        anomalies(client, database=db, window=WINDOW, kinds=kinds)


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="risky field pattern"):
        Thresholds(lag_ms=1, lag_offsets=1, card_max_age_s=1, risky_fields=("x'; DROP",))
    with pytest.raises(ValueError, match="lag_ms"):
        Thresholds(lag_ms=-1, lag_offsets=1, card_max_age_s=1, risky_fields=())
    with pytest.raises(ValueError, match="HANDOFFS_RISKY_FIELDS"):
        thresholds(risky_fields="grant.*,*")
    assert thresholds(lag_ms=5, risky_fields="a,b*").risky_fields == ("a", "b*")


def test_lag_fan_out_and_unknown_field_tables(served):
    client, db = served.client(), served.database
    lag = queue_lag(client, WINDOW, database=db, tenant="acme")
    # jobs: 10, 60,000, 60,001 (exact percentiles: an observed value); q4's reject not counted;
    # no producer recorded its enqueue; jobs' head 1,011 (q3), worker consumed up to 10
    got = lag.to_dict(orient="records")
    assert math.isnan(got[1].pop("offsets_behind"))  # mail: no offsets at all
    assert got == [
        {"consumer": "worker", "queue": "jobs", "handoffs": 3, "p50_ms": 60_000.0,
         "p95_ms": 60_001.0, "max_ms": 60_001, "enqueued": 0, "waiting": 0, "stalled": 0,
         "offsets_behind": 1_001},
        {"consumer": "worker2", "queue": "mail", "handoffs": 1, "p50_ms": 500.0,
         "p95_ms": 500.0, "max_ms": 500, "enqueued": 0, "waiting": 0, "stalled": 0},
    ]  # fmt: skip
    fan = task_fan_out(client, WINDOW, database=db, tenant="acme")
    # orch: tf1 (3 experts, 4 attempts), tf2 (2, 2); orch2: tg1 (3, 3), tg2 (1, 1); planner:
    # p1..p4, one expert and one attempt each
    assert fan.to_dict(orient="records") == [
        {"orchestrator": "orch", "tasks": 2, "experts_p50": 3.0, "experts_p95": 3.0,
         "attempts_p50": 4.0, "attempts_p95": 4.0},
        {"orchestrator": "orch2", "tasks": 2, "experts_p50": 3.0, "experts_p95": 3.0,
         "attempts_p50": 3.0, "attempts_p95": 3.0},
        {"orchestrator": "planner", "tasks": 4, "experts_p50": 1.0, "experts_p95": 1.0,
         "attempts_p50": 1.0, "attempts_p95": 1.0},
    ]  # fmt: skip
    unk = unknown_fields(client, WINDOW, database=db)
    assert [tuple(r) for r in unk.itertuples(index=False)] == [
        ("worker", "", "colour", 1),
        ("worker", "", "tenant_hint", 1),
        ("worker", "2", "color", 1),
        ("worker", "2", "grant.scope", 1),
        ("worker", "2", "handoff.amount_usd", 1),
        ("worker", "3", "permission.level", 1),
    ]
    empty = Window(start=WINDOW.end, end=WINDOW.end + (WINDOW.end - WINDOW.start))
    for fn in (queue_lag, task_fan_out, unknown_fields, topology_cards):
        assert list(fn(client, empty, database=db).columns) == list(
            fn(client, WINDOW, database=db).columns
        )
    assert len(queue_lag(client, WINDOW, database=db, tenant="nobody")) == 0
    with pytest.raises(TypeError, match="Window"):
        queue_lag(client, "last 24 h", database=db)  # type: ignore[arg-type]


def test_topology_cards_and_slices(served):
    client, db = served.client(), served.database
    cards = topology_cards(client, WINDOW, database=db, tenant="acme")
    got = {(r.topology, r.kind): (r.handoffs, r.flagged) for r in cards.itertuples()}
    # in_process s1..s4; agent_as_tool p1..p4 + fa/fb/fc (10); shared_queue q1..q5;
    # federated_a2a a1..a6
    assert got == {
        ("in_process", "bounce"): (4, 0),
        ("in_process", "unfiltered_sensitive_history"): (4, 2),
        ("agent_as_tool", "partial_result_committed"): (14, 1),
        ("agent_as_tool", "fan_out_all"): (14, 4),
        ("shared_queue", "duplicate_delivery"): (5, 0),
        ("shared_queue", "idempotency_conflict"): (5, 0),
        ("shared_queue", "duplicate_execution"): (5, 0),
        ("shared_queue", "consumer_lag"): (5, 2),
        ("shared_queue", "consumer_stalled"): (5, 0),
        ("federated_a2a", "invalid_transition"): (6, 1),
        ("federated_a2a", "stale_agent_card"): (6, 2),
        ("federated_a2a", "card_skill_refused"): (6, 0),
    }
    assert cards.loc[cards["kind"] == "consumer_lag", "rate"].item() == pytest.approx(2 / 5)
    none = topology_cards(client, WINDOW, database=db, tenant="nobody")
    assert (none["handoffs"] == 0).all() and none["rate"].map(math.isnan).all()
    by_kind = funnel(client, database=db, window=WINDOW, by="message_kind", tenant="acme")
    assert dict(zip(by_kind["message_kind"], by_kind["volume"], strict=True)) == {
        "": 36, "command": 3, "event": 1}  # fmt: skip
    by_version = funnel(client, database=db, window=WINDOW, by=("schema_version",))
    assert dict(zip(by_version["schema_version"], by_version["volume"], strict=True)) == {
        "": 34, "2": 3, "3": 3}  # fmt: skip


def test_the_cli_shows_the_kinds_and_tables(served, capsys):
    from handoffs.cli import main

    store = ["--store", f"http://127.0.0.1:{served.query_port}", "--database", served.database]
    win = ["--from", "2026-11-23T10:00:00Z", "--to", "2026-11-23T11:00:00Z",
           "--as-of", "2026-11-23T12:00:00Z"]  # fmt: skip
    assert main(["anomalies", *win, *store, "--json", "--examples", "5"]) == 0
    kinds = {r["kind"]: r for r in json.loads(capsys.readouterr().out)}
    assert {k: kinds[k]["examples"] for k in EXPECTED} == EXPECTED
    assert main(["metrics", *win, *store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["volume"] == 40 and doc["tasks"]["tasks"] == 34
    assert [r["queue"] for r in doc["queue_lag"]] == ["jobs", "mail"]
    assert [r["orchestrator"] for r in doc["task_fan_out"]] == ["orch", "orch2", "planner"]
    assert len(doc["unknown_fields"]) == 6
    assert main(["metrics", *win, *store]) == 0
    human = capsys.readouterr().out
    assert "queue lag" in human and "handoff.amount_usd" in human and "orch2" in human
    assert main(["metrics", *win, *store, "--json", "--by", "message_kind"]) == 0
    assert {r["message_kind"] for r in json.loads(capsys.readouterr().out)} == {
        "",
        "command",
        "event",
    }
