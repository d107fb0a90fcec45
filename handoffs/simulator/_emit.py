"""The I/O half of the simulator: planned steps -> the real shim -> the real OTLP/HTTP exporter.

One TracerProvider + BatchSpanProcessor + OTLPSpanExporter per tenant, each exporter sending
that tenant's bearer token (serve binds the tenant to the token). Every agent has its own
HandoffTracer (strict, so a planner bug raises instead of emitting garbage) plus a lenient
one for the deliberate after_terminal messages. Each receiving agent joins the handoff from
the sender's wire form (`receive(to_wire())`), the way a real remote agent would.

A planned attempt whose envelope names `retry_of` is created with the shim's `retry()` on
the sender's view of the earlier attempt; while that one is `unknown` (a blind retry) the
strict tracer refuses, so the lenient one sends it (flagged `handoff.retry_unresolved`).
The tenant claim on a transition (`handoff.tenant`) goes through the shim's `extra`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from collector import Envelope, HandoffTracer, replaying
from collector.contract import RETRY_NEEDS_RESOLUTION
from handoffs.simulator._model import PlannedHandoff, Step, TaskPlan

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from collector import Handoff

__all__ = ["EmitStats", "Emitter"]

#: Spans queued per tenant before the emitter waits for the exporter (backpressure, so the
#: BatchSpanProcessor's bounded queue never overflows and drops spans).
_FLUSH_EVERY = 4096
_QUEUE_SIZE = 4 * _FLUSH_EVERY


class _CountingExporter(SpanExporter):
    """Delegates to the real exporter and counts spans exported and spans that failed."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.ok = 0
        self.failed = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        with self._lock:
            if result == SpanExportResult.SUCCESS:
                self.ok += len(spans)
            else:
                self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def otlp_exporter_factory(
    otlp_url: str, *, timeout_s: float = 30.0
) -> Callable[[str, str | None], SpanExporter]:
    """Factory of real OTLP/HTTP exporters to `otlp_url` (http://host:port), one per tenant token."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = otlp_url.rstrip("/") + "/v1/traces"

    def make(tenant: str, token: str | None) -> SpanExporter:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=timeout_s)

    return make


@dataclass(frozen=True, slots=True)
class EmitStats:
    """What an emitter did: spans created by the shim, exported OK, failed to export
    (after the exporter's own retries), and the ground truth of what was planned: fault
    labels counted per handoff, overall and per topology."""

    spans: int
    exported: int
    export_failed: int
    tasks: int
    intents: int
    handoffs: int
    faults: Mapping[str, int]
    topologies: Mapping[str, int]
    modes: Mapping[str, int]
    tenants: Mapping[str, int]
    #: per topology: its tasks, intents and handoffs, and its handoffs per fault label
    by_topology: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Live:
    wire: dict[str, Any]
    state: str
    handles: dict[str, Handoff]


class Emitter:
    """Drives TaskPlans through HandoffTracers into per-tenant OTLP exporters.

    `exporter_factory(tenant, token) -> SpanExporter` (keyword-only) builds each tenant's
    exporter: use `otlp_exporter_factory(url)` for serve, or an InMemorySpanExporter in tests.
    `tokens` maps tenant -> bearer token (None/absent: no Authorization header).
    Not thread-safe: one thread emits. Call `close()` (flushes) when done.
    """

    def __init__(
        self,
        *,
        exporter_factory: Callable[[str, str | None], SpanExporter],
        tokens: Mapping[str, str] | None = None,
        service_name: str = "handoffs-simulator",
    ) -> None:
        self._factory = exporter_factory
        self._tokens = dict(tokens or {})
        self._service = service_name
        self._providers: dict[str, TracerProvider] = {}
        self._exporters: dict[str, _CountingExporter] = {}
        self._tracers: dict[tuple[str, str, bool], HandoffTracer] = {}
        self._live: dict[str, _Live] = {}
        self._pending: Counter[str] = Counter()
        self._spans = 0
        self._tasks = 0
        self._intents = 0
        self._handoffs: dict[str, PlannedHandoff] = {}
        self._truth: dict[str, Counter[str]] = {
            k: Counter() for k in ("faults", "topologies", "modes", "tenants")
        }
        self._by_topology: dict[str, Counter[str]] = {}
        self._n_handoffs = 0
        self._closed = False

    # -- providers and tracers --------------------------------------------------------------

    def _provider(self, tenant: str) -> TracerProvider:
        p = self._providers.get(tenant)
        if p is None:
            exporter = _CountingExporter(self._factory(tenant, self._tokens.get(tenant)))
            p = TracerProvider(
                resource=Resource.create(
                    {"service.name": f"{self._service}-{tenant}", "handoffs.tenant": tenant}
                )
            )
            p.add_span_processor(
                BatchSpanProcessor(
                    exporter,
                    max_queue_size=_QUEUE_SIZE,
                    max_export_batch_size=2048,
                    schedule_delay_millis=500,
                )
            )
            self._providers[tenant] = p
            self._exporters[tenant] = exporter
        return p

    def _tracer(self, tenant: str, actor: str, *, strict: bool = True) -> HandoffTracer:
        key = (tenant, actor, strict)
        t = self._tracers.get(key)
        if t is None:
            t = HandoffTracer(actor=actor, tracer_provider=self._provider(tenant), strict=strict)
            self._tracers[key] = t
        return t

    # -- emission ---------------------------------------------------------------------------

    def register(self, plan: TaskPlan) -> None:
        """Record a task's ground truth; call once per task before emitting its steps."""
        self._tasks += 1
        self._intents += plan.intents
        self._truth["topologies"][plan.topology] += 1
        topo = self._by_topology.setdefault(plan.topology, Counter())
        topo.update(tasks=1, intents=plan.intents, handoffs=len(plan.handoffs))
        for h in plan.handoffs:
            topo.update(h.faults)
            self._handoffs[h.handoff_id] = h
            self._n_handoffs += 1
            self._truth["modes"][str(h.envelope["mode"])] += 1
            self._truth["tenants"][h.tenant] += 1
            for f in h.faults:
                self._truth["faults"][f] += 1

    def emit_task(self, plan: TaskPlan) -> None:
        """Register and emit every step of a task, in time order (backfill)."""
        self.register(plan)
        for step in plan.steps:
            self.emit_step(step)

    def emit_step(self, step: Step) -> None:
        """Emit one planned step through the shim (spans go to the tenant's exporter); a
        replayed copy's steps inside collector.replaying()."""
        planned = self._handoffs[step.handoff_id]
        tenant = planned.tenant
        with replaying() if step.replay else nullcontext():
            self._emit(planned, step)
        self._spans += 1
        self._pending[tenant] += 1
        if self._pending[tenant] >= _FLUSH_EVERY:
            self._providers[tenant].force_flush()
            self._pending[tenant] = 0

    def _emit(self, planned: PlannedHandoff, step: Step) -> None:
        tenant = planned.tenant
        if step.event == "create":
            prev = self._live.get(str(planned.envelope.get("retry_of")))
            if prev is not None:
                # the sender's view of the earlier attempt, as its latest message says
                unresolved = prev.state in RETRY_NEEDS_RESOLUTION
                tracer = self._tracer(tenant, step.actor, strict=not unresolved)
                earlier = tracer.receive(dict(prev.wire, state=prev.state))
                h = tracer.retry(earlier, step.handoff_id, at=step.at_ns)
            else:
                h = self._tracer(tenant, step.actor).create(
                    Envelope(**planned.envelope), at=step.at_ns, **step.attrs
                )
            self._live[step.handoff_id] = _Live(h.to_wire(), h.state, {step.actor: h})
        else:
            live = self._live[step.handoff_id]
            if step.event == "redeliver":
                live.handles[step.actor].redeliver(at=step.at_ns)
            elif step.illegal:
                late = self._tracer(tenant, step.actor, strict=False).receive(
                    dict(live.wire, state=live.state)
                )
                late.transition(step.event, at=step.at_ns, **step.attrs)
            else:
                known = live.handles.get(step.actor)
                if known is None or known.state != live.state:
                    # this agent learns the current state from the latest message
                    known = self._tracer(tenant, step.actor).receive(
                        dict(live.wire, state=live.state)
                    )
                    live.handles[step.actor] = known
                live.state = known.transition(step.event, at=step.at_ns, **step.attrs)

    def forget(self, handoff_ids: Sequence[str]) -> None:
        """Drop per-handoff state of finished tasks (keeps long runs at constant memory)."""
        for hid in handoff_ids:
            self._live.pop(hid, None)
            self._handoffs.pop(hid, None)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Export everything queued; True when every provider flushed within the timeout."""
        ok = True
        for p in self._providers.values():
            ok = p.force_flush(int(timeout_s * 1000)) and ok
        self._pending.clear()
        return ok

    def close(self) -> EmitStats:
        """Flush and shut every provider down; returns the final stats. Idempotent."""
        if not self._closed:
            self.flush()
            for p in self._providers.values():
                p.shutdown()
            self._closed = True
        return self.stats()

    def stats(self) -> EmitStats:
        return EmitStats(
            spans=self._spans,
            exported=sum(e.ok for e in self._exporters.values()),
            export_failed=sum(e.failed for e in self._exporters.values()),
            tasks=self._tasks,
            intents=self._intents,
            handoffs=self._n_handoffs,
            faults=dict(self._truth["faults"]),
            topologies=dict(self._truth["topologies"]),
            modes=dict(self._truth["modes"]),
            tenants=dict(self._truth["tenants"]),
            by_topology={t: dict(c) for t, c in self._by_topology.items()},
        )
