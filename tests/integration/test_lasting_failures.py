"""Failures that last or never emit a span, on a hand-computed fixture sent through the real
shim, OTel SDK and OTLP/HTTP exporter into a real `handoffs serve`: sustained_rejections,
card_skill_refused and consumer_stalled, each with its near misses, exact ids; the runs'
report; the queue table per consumer; the thresholds as settings; the CLI.

Tenant `acme`, window [t0, t0+12h), as_of t0+12h+60s. Times are seconds after t0.

sustained_rejections (each group 6 handoffs an hour, rejected `busy` or accepted then
canceled; handoff i of hour h is `<g><hh>-<i>`, the first r of the hour rejected):
  coder/code.write   hours 0-5, 4 of 6 rejected in hours 2, 3, 4: a 3-hour run -> flagged
                     (rejection_spike catches hours 2 and 3 only: by hour 4 its 24-hour
                     baseline has absorbed the outage, 8 of 24 rejected)
  oncall/incident    hours 9-11, 3 of 6 (exactly 50 %) in hours 10 and 11 -> flagged, ongoing
  mailer/smtp        hours 5-8, 5 of 6 in hour 7 only: a 1-hour outage is a spike, not
                     sustained
  search/web         hours 3-7, 3 of 6 in hour 5 and 4 of 4 in hour 6: hour 6 has fewer than
                     5 settled, so no 2-hour run
  reviewer/review    hours 7-11, 4 of 6 in hours 8 and 10, 2 of 6 in hour 9: not consecutive
card_skill_refused (federated_a2a to `writer`, asking code.write; card fetched s before):
  k1 (3600 s, card lists code.write + code.test, rejected unknown_capability), k8 (exactly
  86,400 s: still fresh). Not: k2 (card lists code.test only: stale_agent_card), k3
  (86,401 s: stale_agent_card), k4 (rejected busy), k5 (accepted), k6 (no card), k7 (asks
  for nothing)
consumer_stalled (shared_queue; `enqueued` by the producer at 3600 + s):
  m1 (jobs offset 10 for billing at 0, expired at 300), m2 (jobs 11 at 60, waiting): the
  head moved to 21. Not: m3 (jobs 12 for ledger, accepted), n1 (mail 5 at 30: nothing after
  it on mail), n2 (jobs 13 at 200, rejected), n3 (jobs 20 at 12h-100s: 160 s old at
  as_of), n5 (no enqueue recorded); n4 (jobs 21 for ledger at 12h-60s, accepted)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from analytics import Window, anomalies, queue_lag, rejection_spikes, sustained_rejections
from collector import AgentCardRef, Enqueued, Envelope, HandoffTracer, QueuePosition
from serve.testing import ServeHandle, start_serve

T0 = datetime(2026, 11, 23, tzinfo=UTC)
AS_OF = T0 + timedelta(hours=12, seconds=60)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=12), as_of=AS_OF)
TOKEN = "tok-acme"
H = 3600
KINDS = ("rejection_spike", "sustained_rejections", "stale_agent_card", "card_skill_refused",
         "consumer_stalled")  # fmt: skip
#: group prefix -> (to_agent, capability, {hour: (handoffs, rejected)})
GROUPS = {
    "cw": (
        "coder",
        "code.write",
        {0: (6, 0), 1: (6, 0), 2: (6, 4), 3: (6, 4), 4: (6, 4), 5: (6, 0)},
    ),
    "oc": ("oncall", "incident", {9: (6, 0), 10: (6, 3), 11: (6, 3)}),
    "ms": ("mailer", "smtp", {5: (6, 0), 6: (6, 0), 7: (6, 5), 8: (6, 0)}),
    "sw": ("search", "web", {3: (6, 0), 4: (6, 0), 5: (6, 3), 6: (4, 4), 7: (6, 0)}),
    "rv": ("reviewer", "review", {7: (6, 0), 8: (6, 4), 9: (6, 2), 10: (6, 4), 11: (6, 0)}),
}


def _ids(prefix: str, hours: tuple[int, ...]) -> list[str]:
    table = GROUPS[prefix][2]
    return [f"{prefix}{h:02d}-{i}" for h in hours for i in range(table[h][1])]


EXPECTED = {
    "rejection_spike": sorted(
        _ids("cw", (2, 3))
        + _ids("ms", (7,))
        + _ids("sw", (5,))
        + _ids("rv", (8,))
        + _ids("oc", (10,))
    ),
    "sustained_rejections": sorted(_ids("cw", (2, 3, 4)) + _ids("oc", (10, 11))),
    "stale_agent_card": ["k2", "k3"],
    "card_skill_refused": ["k1", "k8"],
    "consumer_stalled": ["m1", "m2"],
}


def _at(sec: float) -> datetime:
    return T0 + timedelta(seconds=sec)


def _iso(sec: float) -> str:
    return _at(sec).strftime("%Y-%m-%dT%H:%M:%SZ")


class Agents:
    """One shim tracer per agent, all exporting to serve as tenant acme."""

    def __init__(self, serve: ServeHandle) -> None:
        exporter = OTLPSpanExporter(
            f"{serve.otlp_url}/v1/traces", headers={"authorization": f"Bearer {TOKEN}"}
        )
        self.provider = TracerProvider(resource=Resource.create({"service.name": "lasting"}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracers: dict[str, HandoffTracer] = {}

    def __call__(self, actor: str) -> HandoffTracer:
        if actor not in self._tracers:
            self._tracers[actor] = HandoffTracer(actor, tracer_provider=self.provider)
        return self._tracers[actor]

    def send(self, h: str, sec: float, to: str, topology: str, caps: tuple[str, ...] = (), **kw):
        env = Envelope(task_id=f"t-{h}", handoff_id=h, from_agent="planner", to_agent=to,
                       mode="delegate", topology=topology, capabilities=caps)  # fmt: skip
        return self("planner").create(env, _at(sec), **kw)

    def by(self, actor: str, sent):
        return self(actor).receive(sent.to_wire())


def fixture_spans(a: Agents) -> None:
    for prefix, (to, cap, hours) in GROUPS.items():
        for hour, (n, rejected) in hours.items():
            for i in range(n):
                sec = hour * H + 300 * i
                sent = a.send(f"{prefix}{hour:02d}-{i}", sec, to, "in_process", (cap,))
                if i < rejected:
                    a.by(to, sent).reject(_at(sec + 1), error_code="busy")
                else:
                    a.by(to, sent).accept(_at(sec + 1))
                    sent.cancel(_at(sec + 2))
    url = "https://writer.example/.well-known/agent-card.json"
    full = ("code.write", "code.test")
    for h, age, skills, caps, outcome in (
        ("k1", 3600, full, ("code.write",), "unknown_capability"),
        ("k8", 86_400, full, ("code.write",), "unknown_capability"),
        ("k2", 3600, ("code.test",), ("code.write",), "unknown_capability"),
        ("k3", 86_401, full, ("code.write",), "unknown_capability"),
        ("k4", 3600, full, ("code.write",), "busy"),
        ("k5", 3600, full, ("code.write",), None),
        ("k6", None, (), ("code.write",), "unknown_capability"),
        ("k7", 3600, full, (), "unknown_capability"),
    ):
        card = None if age is None else AgentCardRef(url, _iso(600 - age), skills)
        sent = a.send(h, 600, "writer", "federated_a2a", caps, agent_card=card)
        if outcome is None:
            a.by("writer", sent).accept(_at(601))
        else:
            a.by("writer", sent).reject(_at(601), error_code=outcome)
    q, end = H, 12 * H
    m1 = a.send("m1", q, "billing", "shared_queue", enqueued=Enqueued("jobs", 10))
    m1.expire(_at(q + 300), error_code="not_accepted")
    a.send("m2", q + 60, "billing", "shared_queue", enqueued=Enqueued("jobs", 11))
    m3 = a.send("m3", q + 120, "ledger", "shared_queue", enqueued=Enqueued("jobs", 12))
    a.by("ledger", m3).accept(_at(q + 130), queue=QueuePosition("jobs", _at(q + 120), 12, 12))
    a.send("n1", q + 30, "billing", "shared_queue", enqueued=Enqueued("mail", 5))
    n2 = a.send("n2", q + 200, "billing", "shared_queue", enqueued=Enqueued("jobs", 13))
    a.by("billing", n2).reject(_at(q + 210), error_code="busy")
    a.send("n3", end - 100, "billing", "shared_queue", enqueued=Enqueued("jobs", 20))
    n4 = a.send("n4", end - 60, "ledger", "shared_queue", enqueued=Enqueued("jobs", 21))
    a.by("ledger", n4).accept(_at(end - 50), queue=QueuePosition("jobs", _at(end - 60), 21, 21))
    a.send("n5", q, "billing", "shared_queue")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[ServeHandle]:
    serve = start_serve(tmp_path_factory.mktemp("lasting"), f"{TOKEN}=acme")
    try:
        agents = Agents(serve)
        fixture_spans(agents)
        agents.provider.shutdown()
        serve.wait_stored()
        yield serve
    finally:
        serve.stop()


def _flagged(served, window=WINDOW, kinds=KINDS) -> dict[str, list[str]]:
    df = anomalies(served.client(), database=served.database, window=window, tenant="acme",
                   examples=100, kinds=kinds)  # fmt: skip
    return {r.kind: list(r.examples) for r in df.itertuples()}


def test_each_kind_flags_exactly_the_hand_computed_handoffs(served):
    assert _flagged(served) == EXPECTED


def test_the_runs_are_reported_whole_with_their_end_or_ongoing(served):
    client, db = served.client(), served.database
    df = sustained_rejections(client, database=db, window=WINDOW, tenant="acme")
    got = [
        (r.start, r.end, r.ongoing, r.hours, r.to_agent, r.capability, r.settled, r.rejected,
         r.handoffs)
        for r in df.itertuples()
    ]  # fmt: skip
    assert got == [
        (_at(2 * H), _at(5 * H), False, 3, "coder", "code.write", 18, 12, 12),
        (_at(10 * H), None, True, 2, "oncall", "incident", 12, 6, 6),
    ]
    assert df["rejection_rate"].tolist() == [pytest.approx(2 / 3), 0.5]
    # a window inside the run: the run whole, the window's own rejected handoffs counted
    inside = Window(start=_at(3 * H + 600), end=_at(4 * H), as_of=AS_OF)
    df = sustained_rejections(client, database=db, window=inside, tenant="acme")
    assert df[["start", "end", "hours", "handoffs"]].values.tolist() == [
        [_at(2 * H), _at(5 * H), 3, 2]  # 03:10 on: handoffs 2 and 3 of hour 3
    ]
    assert _flagged(served, inside, ("sustained_rejections",)) == {
        "sustained_rejections": ["cw03-2", "cw03-3"]
    }
    # the hour after the coder's run, and the hour of the mailer's 1-hour outage: no run
    after = Window(start=_at(5 * H), end=_at(8 * H), as_of=AS_OF)
    assert sustained_rejections(client, database=db, window=after, tenant="acme").empty
    assert _flagged(served, after, ("sustained_rejections", "rejection_spike")) == {
        "rejection_spike": sorted(_ids("ms", (7,)) + _ids("sw", (5,))),
        "sustained_rejections": [],
    }
    # the clock inside the coder's run: ongoing then (its fourth hour not over)
    then = Window(start=T0, end=_at(4 * H), as_of=_at(4 * H + 60))
    df = sustained_rejections(client, database=db, window=then, tenant="acme")
    assert df[["start", "ongoing", "to_agent"]].values.tolist() == [[_at(2 * H), True, "coder"]]
    spikes = rejection_spikes(client, database=db, window=WINDOW, tenant="acme")
    assert sorted(spikes.loc[spikes["to_agent"] == "coder", "bucket_start"]) == [
        _at(2 * H), _at(3 * H)]  # fmt: skip


def test_thresholds_are_settings(served, monkeypatch):
    monkeypatch.setenv("HANDOFFS_SUSTAINED_HOURS", "3")
    assert _flagged(served, kinds=("sustained_rejections",)) == {
        "sustained_rejections": _ids("cw", (2, 3, 4))
    }
    monkeypatch.setenv("HANDOFFS_SUSTAINED_HOURS", "2")
    monkeypatch.setenv("HANDOFFS_SUSTAINED_REJECTION_RATE", "0.6")
    assert _flagged(served, kinds=("sustained_rejections",)) == {
        "sustained_rejections": _ids("cw", (2, 3, 4))
    }
    monkeypatch.setenv("HANDOFFS_SUSTAINED_REJECTION_RATE", "0.5")
    monkeypatch.setenv("HANDOFFS_SUSTAINED_MIN_SETTLED", "4")  # search's hour 6 now counts
    assert _flagged(served, kinds=("sustained_rejections",)) == {
        "sustained_rejections": sorted(
            _ids("cw", (2, 3, 4)) + _ids("oc", (10, 11)) + _ids("sw", (5, 6))
        )
    }
    monkeypatch.delenv("HANDOFFS_SUSTAINED_MIN_SETTLED")
    monkeypatch.setenv("HANDOFFS_CONSUMER_STALL_S", "100")  # n3 waited 160 s
    assert _flagged(served, kinds=("consumer_stalled",)) == {"consumer_stalled": ["m1", "m2", "n3"]}
    monkeypatch.setenv("HANDOFFS_AGENT_CARD_MAX_AGE_S", "3599")  # k1's card is 3600 s old
    assert _flagged(served, kinds=("card_skill_refused", "stale_agent_card")) == {
        "stale_agent_card": ["k1", "k2", "k3", "k7", "k8"],  # k7 too: a card-related reject
        "card_skill_refused": [],
    }
    for name, bad in (("HANDOFFS_SUSTAINED_REJECTION_RATE", "1.5"),
                      ("HANDOFFS_SUSTAINED_HOURS", "0"), ("HANDOFFS_CONSUMER_STALL_S", "soon")):  # fmt: skip
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            _flagged(served)
        monkeypatch.delenv(name)


def test_the_queue_table_shows_a_stalled_consumer(served):
    lag = queue_lag(served.client(), WINDOW, database=served.database, tenant="acme")
    rows = {(r["consumer"], r["queue"]): r for r in lag.to_dict(orient="records")}
    assert list(rows) == [("billing", "jobs"), ("billing", "mail"), ("ledger", "jobs")]
    cols = ("handoffs", "enqueued", "waiting", "stalled", "offsets_behind")
    # billing never took anything: jobs' head is 21, its first message 10 (12 behind)
    assert [rows[k][c] for k in rows for c in cols] == [
        0, 4, 3, 2, 12.0,
        0, 1, 1, 0, 1.0,
        2, 2, 0, 0, 0.0,
    ]  # fmt: skip
    assert math.isnan(rows[("billing", "jobs")]["p50_ms"])
    assert rows[("ledger", "jobs")]["p50_ms"] == 10_000.0


def test_the_cli_says_when_and_shows_the_queue(served, capsys):
    from handoffs.cli import main

    store = ["--store", f"http://127.0.0.1:{served.query_port}", "--database", served.database]
    win = ["--from", WINDOW.start.isoformat(), "--to", WINDOW.end.isoformat(),
           "--as-of", AS_OF.isoformat(), "--tenant", "acme"]  # fmt: skip
    assert main(["anomalies", *win, *store, "--json"]) == 0
    held = next(r for r in json.loads(capsys.readouterr().out)
                if r["kind"] == "sustained_rejections")  # fmt: skip
    assert held["count"] == 18
    assert [(w["start"], w["end"], w["ongoing"], w["handoffs"]) for w in held["when"]] == [
        ("2026-11-23T02:00:00Z", "2026-11-23T05:00:00Z", False, 12),
        ("2026-11-23T10:00:00Z", None, True, 6),
    ]
    assert main(["anomalies", *win, *store]) == 0
    out = capsys.readouterr().out
    when = out[out.index("sustained_rejections, when") :].splitlines()
    assert when[3].split() == ["2026-11-23", "02:00", "2026-11-23", "05:00", "3", "coder",
                               "code.write", "12/18", "66.7%", "12"]  # fmt: skip
    assert when[4].split()[:4] == ["2026-11-23", "10:00", "ongoing", "2"]
    assert main(["metrics", *win, *store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["consumer"], r["stalled"]) for r in doc["queue_lag"]] == [
        ("billing", 2), ("billing", 0), ("ledger", 0)]  # fmt: skip


def test_the_dashboard_says_when(served, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH

    monkeypatch.setenv("HANDOFFS_STORE", f"http://127.0.0.1:{served.query_port}")
    monkeypatch.setenv("HANDOFFS_DATABASE", served.database)
    at = AppTest.from_file(str(APP_PATH), default_timeout=120)
    for k, v in {"from": WINDOW.start, "to": WINDOW.end, "as_of": AS_OF}.items():
        at.query_params[k] = v.isoformat()
    at.run()
    at.switch_page("views/anomalies.py").run()
    assert not at.exception, [e.value for e in at.exception]
    (table,) = [d.value for d in at.dataframe if "hours" in d.value.columns]
    assert table[["start", "end", "hours", "to_agent", "handoffs"]].values.tolist() == [
        ["2026-11-23 02:00 UTC", "2026-11-23 05:00 UTC", 3, "coder", 12],
        ["2026-11-23 10:00 UTC", "ongoing", 2, "oncall", 6],
    ]
    assert table["rejection_rate"].tolist() == [pytest.approx(200 / 3), 50.0]
