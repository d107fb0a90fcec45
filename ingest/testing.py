"""Builders of OTLP test data: spans, requests and handoff transitions as JSON and
protobuf, for tests, the demo's docs and benchmarks (a serve to send them to is in
serve.testing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "create_spans",
    "key_value",
    "request_json",
    "request_protobuf",
    "span_json",
    "transition",
]

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue


def _any_value_json(v: object) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_any_value_json(x) for x in v]}}
    if isinstance(v, dict):
        return {
            "kvlistValue": {
                "values": [{"key": k, "value": _any_value_json(x)} for k, x in v.items()]
            }
        }
    return {"stringValue": str(v)}


def key_value(key: str, value: object) -> KeyValue:
    """One OTLP/protobuf attribute, typed by the value's Python type: bool, int, or else its
    text (the wire contract's scalar types)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def span_json(
    *,
    trace_id: str,
    span_id: str,
    attributes: dict,
    start_ns: int,
    name: str = "handoff",
    end_ns: int | None = None,
    parent_span_id: str = "",
) -> dict:
    """One OTLP/JSON span; attribute values typed by their Python type (int, bool, list...)."""
    return {
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent_span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns or start_ns + 1000),
        "attributes": [{"key": k, "value": _any_value_json(v)} for k, v in attributes.items()],
    }


def request_json(spans: list[dict], *, service: str = "test-agent") -> dict:
    """An OTLP/JSON ExportTraceServiceRequest document holding `spans` (see span_json)."""
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [
                    {"scope": {"name": "ingest.testing", "version": "1"}, "spans": spans}
                ],
            }
        ]
    }


def request_protobuf(spans: list[dict], *, service: str = "test-agent") -> bytes:
    """The same request as request_json, serialized as OTLP protobuf."""
    import copy

    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = copy.deepcopy(request_json(spans, service=service))
    # protobuf's JSON mapping wants base64 ids; OTLP JSON uses hex.
    import base64

    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
    return ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()


def create_spans(k: int, n: int, *, prefix: str = "h", start_ns: int = 0) -> list[dict]:
    """Spans (span_json) of `n` create transitions, request `k` of a series: handoff ids
    `{prefix}-{k}-{i}`, trace and span ids unique across the series (k < 2**32), start times
    start_ns + i (0: now)."""
    import time

    t0 = start_ns or time.time_ns()
    return [
        span_json(
            trace_id=f"{k + 1:08x}{i + 1:024x}",
            span_id=f"{k + 1:08x}{i + 1:08x}",
            attributes=transition(f"{prefix}-{k}-{i}", "create", "", "created"),
            start_ns=t0 + i,
        )
        for i in range(n)
    ]


def transition(
    handoff_id: str,
    event: str,
    from_state: str,
    to_state: str,
    *,
    task_id: str = "task-1",
    actor: str = "agent-b",
    **extra: object,
) -> dict:
    """Wire attributes of one transition (`create` gets the required envelope fields).

    Extra attributes as keywords with `__` for `.`: `handoff__deadline_ms=60_000` sets
    `handoff.deadline_ms`; the Python type picks the OTLP value type (int, bool, list...).
    """
    attrs: dict = {
        "handoff.task_id": task_id,
        "handoff.handoff_id": handoff_id,
        "handoff.event": event,
        "handoff.from_state": from_state,
        "handoff.to_state": to_state,
        "handoff.actor": actor,
    }
    if event == "create":
        attrs.update(
            {
                "handoff.protocol": "aa-handoff/v1",
                "handoff.mode": "delegate",
                "handoff.from_agent": "agent-a",
                "handoff.to_agent": "agent-b",
            }
        )
    attrs.update({k.replace("__", "."): v for k, v in extra.items()})
    return attrs
