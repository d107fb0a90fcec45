"""Derivation per (tenant, trace id): two tenants write spans into one trace id (trace ids
cross organisations by design: a W3C traceparent passed over A2A), each with its own ingest
token, through the real OTel SDK and OTLP/HTTP exporter to a real `handoffs serve`. Each
tenant's derived funnel equals what it is when the same spans come alone: another tenant's
spans neither feed a derivation (a foreign failed run is not taken as the target's run) nor
suppress it (a foreign shim `handoff.create` does not make serve skip the trace)."""

from __future__ import annotations

import contextlib
import random
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import analytics
from ingest.testing import transition
from serve.testing import start_serve, wait_until

MS = 1_000_000
#: tenant -> its ingest token; the `-alone` tenants get the same spans in traces of their own
TOKENS = {"acme": "tokA", "globex": "tokB", "acme-alone": "tokC", "globex-alone": "tokD"}
COUNTS = ("volume", "settled", "in_flight", "accepted", "executed", "committed", "unknown")


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = start_serve(
        tmp_path_factory.mktemp("derive-tenants"),
        ",".join(f"{tok}={tenant}" for tenant, tok in TOKENS.items()),
        env={"HANDOFFS_DERIVE_EVERY_S": "0.25"},
    )
    yield s
    s.stop()


@pytest.fixture
def tracers(serve):
    providers = {}
    for tenant, tok in TOKENS.items():
        p = TracerProvider(resource=Resource.create({"service.name": f"{tenant}-agents"}))
        exporter = OTLPSpanExporter(
            f"{serve.otlp_url}/v1/traces", headers={"authorization": f"Bearer {tok}"}
        )
        p.add_span_processor(SimpleSpanProcessor(exporter))
        providers[tenant] = p
    yield {t: p.get_tracer(f"{t}-app") for t, p in providers.items()}
    for p in providers.values():
        p.shutdown()


class Emit:
    """Spans of one tenant with explicit times (ms after `t0`), as an app's tracer ends them."""

    def __init__(self, tracer: trace.Tracer, t0: int) -> None:
        self.tracer, self.t0 = tracer, t0

    def span(self, name, parent, start, end, *, error=None, attributes=None, **kw) -> trace.Span:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        attrs = {k.replace("__", "."): v for k, v in kw.items()} | (attributes or {})
        s = self.tracer.start_span(
            name, context=ctx, start_time=self.t0 + start * MS, attributes=attrs
        )
        if error:
            s.set_status(trace.Status(trace.StatusCode.ERROR, error))
        s.end(end_time=self.t0 + end * MS)
        return s

    def invoke(self, agent, parent, start, end, *, error=None) -> trace.Span:
        run = self.span(f"invoke_agent {agent}", parent, start, end, error=error,
                        gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent)  # fmt: skip
        if not error:
            self.span("chat gpt-x", run, start + 1, end - 1, gen_ai__operation__name="chat")
        return run

    def transfer(self, src, dst, parent, start) -> trace.Span:
        return self.span(f"execute_tool transfer_to_{dst}", parent, start, start + 1,
                         gen_ai__operation__name="execute_tool",
                         gen_ai__agent__handoff__source__name=src,
                         gen_ai__agent__handoff__target__name=dst)  # fmt: skip


def remote(trace_id: int, span_id: int) -> NonRecordingSpan:
    """A parent received over the wire (a traceparent header): another party's span."""
    return NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )


def globex_spans(e: Emit, coder_error: str | None) -> tuple[int, int]:
    """triage -> billing (billing runs fine); with `coder_error`, also a failed `coder` run
    at 52..55 ms (which must not fail acme's handoff to its own coder). (trace id, the
    transfer span's id)."""
    root = e.span("conversation", None, 0, 100)
    triage = e.invoke("triage", root, 1, 10)
    tool = e.transfer("triage", "billing", triage, 5)
    if coder_error:
        e.invoke("coder", root, 52, 55, error=coder_error)
    e.invoke("billing", root, 20, 30)
    return root.get_span_context().trace_id, tool.get_span_context().span_id


def acme_run(e: Emit, parent: trace.Span) -> None:
    """acme's own spans under a remote parent: a failed `billing` run at 12..15 ms (between
    globex's transfer and globex's billing run) and its own planner -> coder, which commits."""
    e.invoke("billing", parent, 12, 15, error="acme billing outage")
    planner = e.invoke("planner", parent, 40, 50)
    e.transfer("planner", "coder", planner, 45)
    e.invoke("coder", parent, 60, 70)


def acme_shim_create(e: Emit, parent: trace.Span, handoff_id: str) -> None:
    """acme's shim records a handoff of its own in the same trace (a `handoff.create`)."""
    attrs = transition(handoff_id, "create", "", "created", task_id=f"task-{handoff_id}",
                       actor="planner")  # fmt: skip
    e.span("handoff.create", parent, 80, 80, attributes=attrs)


def test_another_tenants_spans_in_the_trace_neither_feed_nor_suppress_derivation(serve, tracers):
    rng = random.Random(20240611)
    now = datetime.now(UTC)
    t0 = int(now.timestamp() * 1e9)
    em = {t: Emit(tr, t0) for t, tr in tracers.items()}

    # shared trace 1: globex's handoff with acme's failed billing run and acme's own handoff
    tid1, tool1 = globex_spans(em["globex"], coder_error="globex coder outage")
    acme_run(em["acme"], remote(tid1, tool1))
    # shared trace 2: globex's handoff with acme's shim `handoff.create` in it
    tid2, tool2 = globex_spans(em["globex"], coder_error=None)
    acme_shim_create(em["acme"], remote(tid2, tool2), "acme-shim-shared")
    # the same spans, each tenant alone in traces of its own
    globex_spans(em["globex-alone"], coder_error="globex coder outage")
    acme_run(em["acme-alone"], remote(rng.getrandbits(128), rng.getrandbits(64)))
    globex_spans(em["globex-alone"], coder_error=None)
    acme_shim_create(em["acme-alone"], remote(rng.getrandbits(128), rng.getrandbits(64)),
                     "acme-shim-alone")  # fmt: skip
    assert serve.wait_stored(60)

    window = analytics.Window(start=now - timedelta(minutes=1), end=now + timedelta(minutes=1))

    def funnels() -> dict[str, dict]:
        with serve.client() as c:
            out = {}
            for tenant in TOKENS:
                row = analytics.funnel(c, database=serve.database, window=window, tenant=tenant)
                out[tenant] = {k: int(row.iloc[0][k]) for k in COUNTS} if len(row) else {}
            return out

    globex_done = {"volume": 2, "accepted": 2, "executed": 2}  # both its handoffs commit
    last: dict = {}

    def derived() -> bool:
        last.update(funnels())
        done = [{k: last[t].get(k) for k in globex_done} for t in ("globex", "globex-alone")]
        return (
            done == [globex_done] * 2
            and last["acme-alone"].get("executed") == 1
            and (last["acme"] == last["acme-alone"])
        )

    with contextlib.suppress(TimeoutError):  # on timeout, the asserts show the funnels
        wait_until(derived, 45, "each tenant's derived funnel")
    assert last["globex"] == last["globex-alone"]
    assert last["acme"] == last["acme-alone"]
    assert last["acme"]["volume"] == 2  # its derived handoff and its shim's create
    assert last["acme"]["executed"] == 1

    with serve.client() as c:
        rows = c.query(
            f"SELECT tenant, trace_id, event, error_code, attributes['handoff.execution.id'] "
            f"FROM {serve.database}.handoff_transitions "
            "WHERE tenant IN ('acme', 'globex') AND trace_id IN {ids:Array(String)}",
            parameters={"ids": [f"{tid1:032x}", f"{tid2:032x}"]},
        ).result_rows
        own = {
            t: set(
                c.query(
                    f"SELECT SpanId FROM {serve.database}.otel_traces WHERE Tenant = {{t:String}}",
                    parameters={"t": t},
                ).result_columns[0]
            )
            for t in ("acme", "globex")
        }
    assert not [r for r in rows if r[2] == "fail"]  # no foreign failure taken for a run
    assert {r[3] for r in rows} <= {""}
    executions = {(r[0], r[4]) for r in rows if r[4]}
    assert executions and all(sid in own[tenant] for tenant, sid in executions)
    # globex's handoffs in both shared traces were derived and committed
    assert {(r[1], r[2]) for r in rows if r[0] == "globex" and r[2] == "commit"} == {
        (f"{tid1:032x}", "commit"),
        (f"{tid2:032x}", "commit"),
    }
