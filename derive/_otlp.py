"""Derived transitions as one OTLP/protobuf ExportTraceServiceRequest. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from derive._model import AttrValue, Derived

#: the instrumentation scope of derived spans
SCOPE: Final = "handoff-observatory.derive"


def _value(v: AttrValue) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, tuple):
        out = AnyValue()
        out.array_value.values.extend(AnyValue(string_value=x) for x in v)
        return out
    return AnyValue(string_value=v)


def encode(derived: Iterable[Derived], *, scope_version: str = "") -> bytes:
    """One request, a resource per service name, spans in the order given (time_ns is both
    start and end: a transition is an instant)."""
    req = ExportTraceServiceRequest()
    by_service: dict[str, list[Derived]] = {}
    for d in derived:
        by_service.setdefault(d.service_name, []).append(d)
    for service, items in by_service.items():
        rs = req.resource_spans.add()
        rs.resource.attributes.append(
            KeyValue(key="service.name", value=AnyValue(string_value=service or "unknown"))
        )
        ss = rs.scope_spans.add()
        ss.scope.name = SCOPE
        ss.scope.version = scope_version
        for d in items:
            ss.spans.append(
                Span(
                    trace_id=bytes.fromhex(d.trace_id),
                    span_id=bytes.fromhex(d.span_id),
                    parent_span_id=bytes.fromhex(d.parent_span_id) if d.parent_span_id else b"",
                    name=d.name,
                    kind=Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=d.time_ns,
                    end_time_unix_nano=d.time_ns,
                    attributes=[KeyValue(key=k, value=_value(v)) for k, v in d.attributes],
                    status=Status(code=Status.STATUS_CODE_UNSET),
                )
            )
    return req.SerializeToString()
