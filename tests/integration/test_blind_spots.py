"""Blind spots end to end: spans of a multi-agent framework no rule knows, sent with the real
OTel SDK and OTLP/HTTP exporter to a real `handoffs serve`, are counted with their scope and
trace id in `handoffs blind-spots`, on `GET /metrics` and on the Overview (AppTest); a
single-agent trace, a trace the GenAI rule derives and a shim-instrumented trace are not.
The verdict table itself: a trace judged blind and derived later drops out.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from streamlit.testing.v1 import AppTest

import analytics
from analytics.coverage import blind_spots
from collector import Envelope, HandoffTracer
from dashboard import APP_PATH
from derive import SpanRecord
from derive._blind import BlindSpotLog, verdicts
from serve.testing import start_serve, wait_until

UNKNOWN = "acme.unknown.framework"
AGENT = "gen_ai.agent.name"
OP = "gen_ai.operation.name"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """A serve deriving every 0.25 s whose /metrics reads the store at every scrape."""
    s = start_serve(
        tmp_path_factory.mktemp("blind"),
        env={"HANDOFFS_DERIVE_EVERY_S": "0.25", "HANDOFFS_METRICS_REFRESH_S": "0"},
    )
    yield s
    s.stop()


def _provider(serve) -> TracerProvider:
    p = TracerProvider(resource=Resource.create({"service.name": "crew-app"}))
    p.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(f"{serve.otlp_url}/v1/traces"),
            schedule_delay_millis=50,
            max_export_batch_size=2,
        )
    )
    return p


def _trace_id(span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


def _unknown_framework(tracer, agents: tuple[str, ...]) -> str:
    """A run of a framework no rule knows: a root and one step span per agent."""
    with tracer.start_as_current_span("acme.crew.kickoff") as root:
        for agent in agents:
            with (
                tracer.start_as_current_span("acme.task.execute", attributes={AGENT: agent}),
                tracer.start_as_current_span("acme.llm.call"),
            ):
                pass
    return _trace_id(root)


def _genai_handoff(tracer) -> str:
    """The GenAI transfer shape the GenAI rule derives (triage -> billing)."""
    with tracer.start_as_current_span("conversation") as root:
        with (
            tracer.start_as_current_span(
                "invoke_agent triage", attributes={OP: "invoke_agent", AGENT: "triage"}
            ),
            tracer.start_as_current_span(
                "execute_tool transfer_to_billing",
                attributes={
                    OP: "execute_tool",
                    "gen_ai.agent.handoff.source.name": "triage",
                    "gen_ai.agent.handoff.target.name": "billing",
                },
            ),
        ):
            pass
        with (
            tracer.start_as_current_span(
                "invoke_agent billing", attributes={OP: "invoke_agent", AGENT: "billing"}
            ),
            tracer.start_as_current_span("chat gpt-x", attributes={OP: "chat"}),
        ):
            pass
    return _trace_id(root)


def _shim_handoff(tracer, provider) -> str:
    """An app's two agents, their handoff recorded by the shim in the same trace."""
    planner = HandoffTracer("planner", tracer_provider=provider)
    coder = HandoffTracer("coder", tracer_provider=provider)
    env = Envelope(task_id="shim-task", handoff_id="shim-h1", from_agent="planner",
                   to_agent="coder", mode="delegate")  # fmt: skip
    with tracer.start_as_current_span("app.request") as root:
        with tracer.start_as_current_span("app.plan", attributes={AGENT: "planner"}):
            h = planner.create(env)
        with tracer.start_as_current_span("app.code", attributes={AGENT: "coder"}):
            r = coder.receive(h.to_wire())
            r.accept()
            r.start()
            r.prepare(evidence_count=1, evidence_valid=True, evidence_refs=["test:1"])
            r.commit(receipt_status="ok")
    return _trace_id(root)


def _verdicts(serve) -> dict[str, bool]:
    """{trace id: blind} of the latest verdict per trace the pass wrote."""
    with serve.client() as c:
        rows = c.query(
            f"SELECT trace_id, argMax(blind, updated) FROM {serve.database}.blind_spots "
            "GROUP BY trace_id"
        ).result_rows
    return {t: bool(b) for t, b in rows}


def _metrics(serve) -> str:
    with urllib.request.urlopen(f"{serve.otlp_url}/metrics", timeout=30) as r:
        return r.read().decode()


def _cli(serve, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "handoffs", "blind-spots", "--store", serve.query_url,
         "--database", serve.database, *args],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def test_an_unknown_multi_agent_framework_is_counted_and_shown(serve, monkeypatch):
    start = datetime.now(UTC) - timedelta(seconds=1)
    provider = _provider(serve)
    tracer = provider.get_tracer(UNKNOWN)
    blind = _unknown_framework(tracer, ("researcher", "writer"))
    single = _unknown_framework(tracer, ("solo",))
    derived = _genai_handoff(provider.get_tracer("support-desk"))
    shim = _shim_handoff(provider.get_tracer("app"), provider)
    provider.shutdown()  # flushes every span to serve

    want = {blind: True, derived: False, shim: False}
    wait_until(lambda: {t: b for t, b in _verdicts(serve).items() if t in want} == want, 60,
               "the pass's verdicts on the four traces")  # fmt: skip
    assert single not in _verdicts(serve)  # one agent: nothing to judge
    window = analytics.Window(start=start, end=datetime.now(UTC) + timedelta(minutes=5))
    with serve.client() as c:
        (found,) = blind_spots(c, database=serve.database, window=window)
        assert analytics.funnel(c, database=serve.database, window=window).iloc[0]["volume"] == 2
    assert (found.tenant, found.scope, found.traces) == ("default", UNKNOWN, 1)
    assert found.examples == (blind,) and found.agents == ("researcher", "writer")

    # the CLI, as JSON and as a table
    span = ["--from", f"{window.start:%Y-%m-%dT%H:%M:%S.%fZ}",
            "--to", f"{window.end:%Y-%m-%dT%H:%M:%S.%fZ}"]  # fmt: skip
    (doc,) = json.loads(_cli(serve, *span, "--json").stdout)
    assert doc["scope"] == UNKNOWN and doc["traces"] == 1 and doc["examples"] == [blind]
    text = _cli(serve, *span).stdout
    assert "1 trace started" in text and UNKNOWN in text and blind in text
    assert "researcher, writer" in text
    other = _cli(serve, *span, "--tenant", "nobody").stdout
    assert other.startswith("no blind spots")

    # GET /metrics (traces that began in the last 24 h)
    line = f'handoffs_blind_spot_traces{{scope="{UNKNOWN}",tenant="default"}} 1.0'
    assert line in _metrics(serve).splitlines()
    assert len(re.findall(r"^handoffs_blind_spot_traces\{", _metrics(serve), re.M)) == 1

    # the Overview: a warning above the tiles naming the scope and the trace
    monkeypatch.setenv("HANDOFFS_STORE", serve.query_url)
    monkeypatch.setenv("HANDOFFS_DATABASE", serve.database)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.query_params["from"] = f"{window.start - timedelta(hours=1):%Y-%m-%dT%H:00:00Z}"
    at.query_params["to"] = f"{window.end + timedelta(hours=1):%Y-%m-%dT%H:00:00Z}"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (warning,) = [w.value for w in at.warning if "no handoff was derived" in w.value]
    assert warning.startswith("**1 traces in which several agents ran but no handoff")
    assert f"scopes {UNKNOWN} (1, tenant default)" in warning
    assert blind in warning and "handoffs blind-spots" in warning


def _span(sid: str, agent: str, *, trace: str = "f" * 32, handoff: bool = False) -> SpanRecord:
    attrs = {AGENT: agent, **({"handoff.handoff_id": "h1"} if handoff else {})}
    return SpanRecord(trace, sid, "", "step", 10**18, 10**18 + 10, scope=UNKNOWN,
                      attributes=attrs)  # fmt: skip


def test_a_blind_trace_derived_later_drops_out(chdb_client, chdb_path, fresh_db, monkeypatch):
    now = [datetime.now(UTC).timestamp()]  # recent: the table keeps a verdict 30 days
    log = BlindSpotLog(fresh_db, clock=lambda: now[0])
    spans = [_span("1", "a"), _span("2", "b")]
    window = analytics.Window(
        start=datetime.fromtimestamp(10**9 - 1, UTC), end=datetime.fromtimestamp(10**9 + 1, UTC)
    )
    assert log.write(chdb_client, verdicts(spans, [])) == 1
    assert log.write(chdb_client, verdicts(spans, [])) == 0  # unchanged: not written again
    (found,) = blind_spots(chdb_client, database=fresh_db, window=window)
    assert found.traces == 1 and found.examples == ("f" * 32,)
    now[0] += 1  # a later pass: the shim's (or a rule's) transition is stored now
    later = [*spans, _span("3", "a", handoff=True)]
    assert log.write(chdb_client, verdicts(later, [])) == 1
    assert blind_spots(chdb_client, database=fresh_db, window=window) == []
    # a restarted serve judges it again and writes the same: still not counted
    again = BlindSpotLog(fresh_db, clock=lambda: now[0] + 1)
    assert again.write(chdb_client, verdicts(later, [])) == 1
    assert blind_spots(chdb_client, database=fresh_db, window=window) == []
    # and the Overview of that day shows no warning
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.query_params["from"] = "2001-09-09T00:00:00Z"
    at.query_params["to"] = "2001-09-10T00:00:00Z"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [w.value for w in at.warning if "no handoff was derived" in w.value]
