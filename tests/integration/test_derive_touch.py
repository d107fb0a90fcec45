"""Which stored spans make a derivation pass read their trace: handoff transitions that
another exporter sends as root spans do not (reading them derives nothing, and costs serve
CPU for every span); a root span of another kind still does. Spans come from the real
OTel SDK and OTLP/HTTP exporter under an instrumentation scope that is not the shim's, as an
app with its own OTel setup (or an SDK in another language) sends them."""

from __future__ import annotations

import re
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import analytics
from serve.testing import wait_until
from tests.integration._derived import funnel_counts

_LIFECYCLE = (
    ("create", "", "created"),
    ("accept", "created", "accepted"),
    ("start", "accepted", "running"),
    ("commit", "running", "committed"),
)


@pytest.fixture(scope="module")
def serve(derive_serve):
    return derive_serve


@pytest.fixture
def tracer(serve):
    p = TracerProvider(resource=Resource.create({"service.name": "node-style-agent"}))
    p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{serve.otlp_url}/v1/traces")))
    yield p.get_tracer("support-desk-otel", "2.0.0")
    p.shutdown()


def _derive_counters(serve) -> dict[str, float]:
    with urllib.request.urlopen(f"{serve.otlp_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^handoffs_derive_(\w+)_total (\S+)$", text, re.M)
    }


def _after_two_passes(serve) -> dict[str, float]:
    """The derive counters once two passes ran after everything sent was stored (the second
    one started after the stored rows' second: the cursor has passed them)."""
    assert serve.wait_stored(60)
    # the pass registers its counters once serve is up (a moment after /health answers)
    counters = wait_until(
        lambda: c if "passes" in (c := _derive_counters(serve)) else None, 30, "derive counters"
    )
    first = counters["passes"]
    wait_until(lambda: _derive_counters(serve)["passes"] >= first + 2, 30, "two derive passes")
    return _derive_counters(serve)


def test_root_transition_spans_of_another_scope_are_not_read(serve, tracer):
    now = datetime.now(UTC)
    before = _after_two_passes(serve)
    for i in range(10):
        hid = f"node-root-{i}"
        for event, frm, to in _LIFECYCLE:  # each transition a root span of its own trace
            tracer.start_span(
                f"handoff.{event}",
                attributes={
                    "handoff.task_id": f"task-{hid}",
                    "handoff.handoff_id": hid,
                    "handoff.event": event,
                    "handoff.from_state": frm,
                    "handoff.to_state": to,
                    "handoff.actor": "coder" if event != "create" else "planner",
                    **(
                        {
                            "handoff.protocol": "aa-handoff/v1",
                            "handoff.mode": "delegate",
                            "handoff.from_agent": "planner",
                            "handoff.to_agent": "coder",
                        }
                        if event == "create"
                        else {}
                    ),
                },
            ).end()
    after = _after_two_passes(serve)
    window = analytics.Window(start=now - timedelta(minutes=5), end=now + timedelta(minutes=5))
    assert funnel_counts(serve, window, ("volume",)) == {"volume": 10}  # stored and counted
    assert after["traces"] == before["traces"]  # no trace read for them
    assert after["spans"] == before["spans"]
    assert after["errors"] == 0

    # a root span of another kind (a workflow's, which a rule may need to see end) is read
    tracer.start_span("checkout workflow", attributes={"app.step": "done"}).end()
    read = _after_two_passes(serve)
    assert read["traces"] >= after["traces"] + 1
    assert read["spans"] >= after["spans"] + 1
