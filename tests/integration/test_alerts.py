"""SLO burn-rate alerts end to end: simulator traffic with an injected regression, real chDB,
`handoffs alerts check` at a time inside the regression (fires) and after it (resolves),
and the watch loop posting to a real HTTP server on loopback.

Traffic: ten hours of seeded simulator handoffs through the real shim, encoded as OTLP and
stored by the ingest path; in hour 2..3 the coder's `code.write` skill is gone (a
SkillOutage: 90% of handoffs asking coder for it are rejected), so P_e2e of handoffs to
coder collapses, and recovers after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from analytics._cli.watch import WebhookSender, run_watch
from analytics.slo.burn import budget_text, load_rules
from analytics.slo.store import evaluate_rules
from foundation.store import apply_schema
from handoffs.cli import main
from handoffs.simulator import Emitter, FailureRates, ScenarioConfig, SkillOutage, run_backfill
from ingest import ingest_requests
from serve.testing import free_port, wait_until

S = 10**9
H = timedelta(hours=1)
MIN = timedelta(minutes=1)
RULES = """\
slos:
  - name: coder-e2e
    objective: p_e2e
    target: 0.95
    window: 30d
    where: {to_agent: coder}
  - name: fleet-unknown
    objective: unknown_rate
    target: 0.995
"""
#: no injected fault but a little background noise: every rate 0 (the simulator's defaults
#: inject each topology's own faults), then a few rejections, failures and resends
QUIET = FailureRates(
    **{
        f.name: 0.0
        for f in fields(FailureRates)
        if f.name not in ("timeout_resolve", "timeout_escalate")
    }
    | {"reject": 0.002, "fail": 0.002, "duplicate_delivery": 0.01}
)


class _Capture(SpanExporter):
    def __init__(self, out: list[bytes]) -> None:
        self.out = out

    def export(self, spans):
        self.out.append(encode_spans(list(spans)).SerializeToString())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def regression(chdb_client, tmp_path_factory):
    """The store with the regression; times: start, outage [start+2h, start+3h), end."""
    # the latest Wednesday 22:00 UTC at least 2 h ago (1970-01-01 was a Thursday), so every
    # planned step is in the wall clock's past and every run sees the same hours: the
    # simulator's traffic follows the hour and weekday, and an outage at night had too few
    # handoffs to burn the page budget
    week_s, ago_s = 7 * 86400, int(datetime.now(UTC).timestamp()) - 2 * 3600
    end_ns = (((ago_s + 2 * 3600) // week_s) * week_s - 2 * 3600) * S
    end = datetime.fromtimestamp(end_ns / S, tz=UTC)
    start = end - 10 * H
    outage = SkillOutage(
        "coder",
        "code.write",
        int((start + 2 * H).timestamp() * S),
        int((start + 3 * H).timestamp() * S),
        0.9,
    )
    bodies: list[bytes] = []
    emitter = Emitter(exporter_factory=lambda tenant, token: _Capture(bodies))
    cfg = ScenarioConfig(seed=11, tenants={"acme": 1.0}, rates=QUIET, outage=outage)
    run_backfill(
        emitter,
        cfg,
        start_ns=int(start.timestamp() * S),
        end_ns=int(end_ns),
        handoffs=3000,
        progress=False,
    )
    emitter.close()
    db = f"t_alerts_{uuid.uuid4().hex[:8]}"
    apply_schema(chdb_client, db)
    ingest_requests(
        chdb_client, db, [("protobuf", b, "sim") for b in bodies], tenant="acme", source="test"
    )
    rules = tmp_path_factory.mktemp("alerts") / "slos.yaml"
    rules.write_text(RULES, encoding="utf-8")
    yield {
        "db": db,
        "rules": str(rules),
        "inside": start + 2 * H + 55 * MIN,
        "after": start + 9 * H + 30 * MIN,
    }
    chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _check(reg, chdb_path, at: datetime, *extra: str) -> int:
    return main(
        [
            "alerts",
            "check",
            "--rules",
            reg["rules"],
            "--store",
            f"chdb://{chdb_path}",
            "--database",
            reg["db"],
            "--as-of",
            _iso(at),
            *extra,
        ]
    )


def test_check_fires_inside_the_regression(regression, chdb_path, capsys):
    assert _check(regression, chdb_path, regression["inside"], "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["firing"] == ["coder-e2e:page", "coder-e2e:ticket"]
    coder, unknown = out["slos"]
    page = coder["alerts"][0]
    assert page["firing"] and page["burn_rates"][0]["long_burn"] > 14.4
    assert page["burn_rates"][0]["short_burn"] > 14.4
    assert coder["budget_remaining"] < 0  # a 90% outage for an hour overspends 1%
    assert unknown["firing"] is False and unknown["budget_remaining"] == 1.0
    # human output: the table with × burn rates, budget and FIRING/ok
    assert _check(regression, chdb_path, regression["inside"]) == 1
    text = capsys.readouterr().out
    assert "budget left" in text and "FIRING" in text and "ok" in text
    assert "1h/5m " in text and "(>14.4×)" in text
    assert "firing: coder-e2e:page, coder-e2e:ticket" in text


def test_check_resolves_after_the_regression(regression, chdb_path, capsys):
    assert _check(regression, chdb_path, regression["after"], "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["firing"] == []
    page = out["slos"][0]["alerts"][0]
    assert page["burn_rates"][0]["long_burn"] < 14.4  # the 1 h window is clean again
    assert out["slos"][0]["budget_remaining"] < 0  # the 30 d budget still carries the outage


def test_check_exits_3_when_the_store_is_unreachable(regression, capsys):
    port = free_port()
    code = main(
        ["alerts", "check", "--rules", regression["rules"], "--store", f"http://127.0.0.1:{port}"]
    )
    assert code == 3
    assert "error:" in capsys.readouterr().err


# ------------------------------------------------------------------ webhook


class _Hook:
    """A real HTTP server on loopback that records JSON bodies and answers `statuses` in turn
    (then 200)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.bodies: list[dict] = []
        self.statuses = list(statuses or [])
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hook.lock:
                    code = hook.statuses.pop(0) if hook.statuses else 200
                    if code == 200:
                        hook.bodies.append(body)
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Hook:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_watch_posts_fire_then_resolve_once_each(regression, chdb_client):
    rules = load_rules(regression["rules"])
    inside, after = regression["inside"], regression["after"]
    times = iter([inside, inside + MIN, inside + 2 * MIN, after, after + MIN])
    with _Hook(statuses=[503]) as hook:  # the first POST fails once: retried
        state = run_watch(
            evaluate=lambda t: evaluate_rules(
                chdb_client, rules, as_of=t, database=regression["db"]
            ),
            send=WebhookSender(hook.url, backoff_s=0.01),
            every=timedelta(0),
            stop=threading.Event(),
            clock=lambda: next(times),
            evaluations=5,
        )
    got = [(b["alert"], b["state"], b["as_of"]) for b in hook.bodies]
    assert got == [
        ("coder-e2e:page", "firing", _iso(inside)),
        ("coder-e2e:ticket", "firing", _iso(inside)),
        ("coder-e2e:page", "resolved", _iso(after)),
        ("coder-e2e:ticket", "resolved", _iso(after)),
    ]
    fire = hook.bodies[0]
    assert fire["text"].startswith("[FIRING] coder-e2e:page: p_e2e (to_agent=coder) burn rate")
    assert fire["slo"] == "coder-e2e" and fire["severity"] == "page"
    assert fire["windows"] == ["1h/5m", "6h/30m"] and fire["where"] == {"to_agent": "coder"}
    assert fire["burn_rates"][0]["long_burn"] > 14.4 and fire["budget_remaining"] < 0
    assert hook.bodies[2]["text"].startswith("[RESOLVED] coder-e2e:page")
    assert {k: v.firing for k, v in state.items()} == {
        "coder-e2e:page": False,
        "coder-e2e:ticket": False,
    }


def test_webhook_sender_retries_5xx_not_4xx_and_reports_a_dead_hook(caplog):
    with _Hook(statuses=[500, 502]) as hook:
        d = WebhookSender(hook.url, attempts=3, backoff_s=0.01)({"alert": "a", "state": "firing"})
        assert (d.ok, d.attempts, d.status) == (True, 3, 200)
        assert hook.bodies == [{"alert": "a", "state": "firing"}]
    with _Hook(statuses=[404]) as hook:
        d = WebhookSender(hook.url, attempts=3, backoff_s=0.01)({"alert": "a"})
        assert (d.ok, d.attempts, d.status) == (False, 1, 404)
    dead = f"http://127.0.0.1:{free_port()}/hook"
    d = WebhookSender(dead, attempts=2, backoff_s=0.01)({"alert": "a"})
    assert not d.ok and d.attempts == 2 and d.status is None and d.error
    assert "webhook delivery of a (None) failed after 2 attempt(s)" in caplog.text


def test_an_undelivered_notification_is_tried_again_next_evaluation(regression, chdb_client):
    rules = load_rules(regression["rules"])[:1]
    inside = regression["inside"]
    times = iter([inside, inside])  # the same instant twice: only the retry differs
    with _Hook(statuses=[500, 500]) as hook:  # page: both attempts fail; ticket goes through
        run_watch(
            evaluate=lambda t: evaluate_rules(
                chdb_client, rules, as_of=t, database=regression["db"]
            ),
            send=WebhookSender(hook.url, attempts=2, backoff_s=0.01),
            every=timedelta(0),
            stop=threading.Event(),
            clock=lambda: next(times),
            evaluations=2,
        )
    assert [(b["alert"], b["as_of"]) for b in hook.bodies] == [
        ("coder-e2e:ticket", _iso(inside)),
        ("coder-e2e:page", _iso(inside)),
    ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_watch_command_stops_cleanly_on_a_signal(sig, regression, query_port, tmp_path):
    """`handoffs watch` as a process, reading over serve's query port: it evaluates, then
    the signal ends it with exit 0. The SLOs here are loose (90%): the simulated traffic's
    own failures (~1-2%) burn a tight budget slowly, and whether the 3 d & 6 h ticket pair
    then fires at the wall clock's now depends on the minute; at 90% nothing can fire."""
    loose = tmp_path / "loose.yaml"
    loose.write_text(RULES.replace("target: 0.95\n", "target: 0.9\n").replace("0.995", "0.9"))
    with _Hook() as hook:
        log = tmp_path / "watch.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "handoffs", "watch", "--rules", str(loose),
                 "--webhook", hook.url, "--every", "1s", "--store",
                 f"http://127.0.0.1:{query_port}", "--database", regression["db"]],
                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            try:
                wait_until(
                    lambda: "evaluated 2 SLO(s)" in log.read_text(), 60, "a first evaluation"
                )
                proc.send_signal(sig)
                assert proc.wait(timeout=30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert "stopping" in log.read_text()
        assert hook.bodies == []


# ------------------------------------------------------------------ dashboard page


@pytest.fixture
def alerts_page(regression, chdb_path, monkeypatch):
    """AppTest of the Alerts page reading the regression store and its rules file."""
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH

    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", regression["db"])
    monkeypatch.setenv("HANDOFFS_SLO_RULES", regression["rules"])

    def run(as_of: datetime | None = None):
        at = AppTest.from_file(str(APP_PATH), default_timeout=60)
        if as_of is not None:
            at.query_params["as_of"] = _iso(as_of)
        at.run()
        at.switch_page("views/alerts.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return run


def test_dashboard_shows_firing_alerts_and_budgets(alerts_page, regression, chdb_client):
    at = alerts_page(regression["inside"])
    errors = [str(e.value) for e in at.error]
    assert len(errors) == 2 and errors[0].startswith("**coder-e2e:page** (page)")
    assert "1h/5m" in errors[0] and "×" in errors[0]
    statuses = evaluate_rules(
        chdb_client,
        load_rules(regression["rules"]),
        as_of=regression["inside"],
        database=regression["db"],
    )
    budgets = {m.label: m.value for m in at.metric}
    assert budgets == {s.rule.name: budget_text(s.budget_remaining) for s in statuses}
    assert budgets["coder-e2e"].startswith("exhausted (burn ")  # overspent: no negative %
    table = at.dataframe[0].value
    assert list(table["state"]) == ["FIRING", "FIRING", "ok", "ok"]
    assert list(table["scope"]) == ["to_agent=coder"] * 2 + ["all"] * 2


def test_dashboard_after_the_regression_shows_nothing_firing(alerts_page, regression):
    at = alerts_page(regression["after"])
    assert not at.error
    assert "No alert is firing." in [str(s.value) for s in at.success]
    assert list(at.dataframe[0].value["state"]) == ["ok"] * 4


def test_dashboard_explains_a_missing_or_bad_rules_file(alerts_page, monkeypatch, tmp_path):
    monkeypatch.setenv("HANDOFFS_SLO_RULES", str(tmp_path / "none.yaml"))
    at = alerts_page()
    assert "No SLO rules file at" in at.info[0].value
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos:\n  - name: x\n    objective: p_e2e\n    target: 9\n", encoding="utf-8")
    monkeypatch.setenv("HANDOFFS_SLO_RULES", str(bad))
    at = alerts_page()
    assert f"{bad}:4: slos[0].target" in at.error[0].value
