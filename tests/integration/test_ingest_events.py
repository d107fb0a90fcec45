"""Span events and links are stored as sent; spans without them get empty arrays.

The writer leaves the event/link columns out of an insert when no span of the group has
any (the table default is the same empty array), so both shapes are checked, mixed in one
request and alone in another.
"""

from __future__ import annotations

import json
import time

from ingest import ingest_requests
from ingest.testing import request_json, span_json, transition

_T0 = time.time_ns()


def _span(i: int, **extra: object) -> dict:
    sp = span_json(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        attributes=transition(f"h-ev-{i}", "create", "", "created"),
        start_ns=_T0 + i,
    )
    sp.update(extra)
    return sp


def test_events_and_links_round_trip_and_default_to_empty(chdb_client, fresh_db) -> None:
    event = {
        "timeUnixNano": str(_T0 + 500),
        "name": "retry",
        "attributes": [{"key": "attempt", "value": {"intValue": "2"}}],
    }
    link = {"traceId": "ab" * 16, "spanId": "cd" * 8, "traceState": "k=v", "attributes": []}
    mixed = request_json([_span(0, events=[event], links=[link]), _span(1)])
    plain = request_json([_span(2), _span(3)])
    summary = ingest_requests(
        chdb_client,
        fresh_db,
        [("json", json.dumps(doc).encode(), name) for doc, name in ((mixed, "m"), (plain, "p"))],
    )
    assert summary.errors == []
    rows = chdb_client.query(
        "SELECT SpanId, Events.Name, Events.Attributes, toUnixTimestamp64Nano(Events.Timestamp[1]),"
        " Links.TraceId, Links.SpanId, Links.TraceState "
        f"FROM {fresh_db}.otel_traces ORDER BY SpanId"
    ).result_rows
    assert [r[0] for r in rows] == [f"{i + 1:016x}" for i in range(4)]
    assert rows[0][1:] == (
        ["retry"],
        [{"attempt": "2"}],
        _T0 + 500,
        ["ab" * 16],
        ["cd" * 8],
        ["k=v"],
    )
    for r in rows[1:]:
        assert r[1:3] == ([], []) and r[4:] == ([], [], []), r
