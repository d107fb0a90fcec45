"""The test double shipped with the shim: an in-memory TracerProvider for handoff spans.

Like OTel's `InMemorySpanExporter` beside `SpanExporter`: tests and users can both record
what a HandoffTracer emits without a collector. Spans are exported synchronously
(SimpleSpanProcessor), so they are visible as soon as the transition method returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector import semconv as sc

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["InMemoryRecorder"]


class InMemoryRecorder:
    """A real SDK TracerProvider (`.provider`) exporting into a real InMemorySpanExporter.

    `.spans()` gives the finished spans in emission order; `.transitions()` the handoff
    transitions among them as dicts of their `handoff.*` and `gen_ai.*` attributes (array
    attributes as tuples); `.clear()` forgets everything recorded. Memory grows with every
    span until `clear()`: meant for tests and short runs.
    """

    __slots__ = ("exporter", "provider")

    def __init__(self, *, resource: Resource | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = (
            TracerProvider(resource=resource) if resource is not None else TracerProvider()
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def transitions(self) -> list[dict[str, Any]]:
        out = []
        for span in self.exporter.get_finished_spans():
            attrs = span.attributes or {}
            if sc.EVENT not in attrs:
                continue
            out.append({k: v for k, v in attrs.items() if k.startswith((sc.PREFIX, "gen_ai."))})
        return out

    def clear(self) -> None:
        self.exporter.clear()

    def shutdown(self) -> None:
        self.provider.shutdown()
