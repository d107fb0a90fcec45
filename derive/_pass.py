"""The derivation pass: read spans of recently touched traces, run the rules, submit what is
new through serve's normal ingest path (validation, spool, dedup, ledger).

A handoff's spans and its target agent's spans arrive in different OTLP requests, so a pass
works on whole stored traces, not on one request. Each pass reads the traces that received a
span a rule may read since its cursor (`otel_traces.InsertedAt`, whole seconds; the last
second is read again, which is harmless: output is deterministic): a span of an
instrumentation scope in derive._rules.SCOPES, a GenAI span named `invoke_agent ...` or
`execute_tool ...` (as the conventions name them), or a root span not of the shim's or
derivation's own scope and not named as a handoff transition (`handoff.<event>`, as the shim
names them: another exporter's transitions, e.g. an OTel SDK in Node, are often roots, and
reading their traces derives nothing). That test reads plain columns, never the attribute
map, so heavy handoff traffic costs only a column scan of the rows stored since the last
pass. It reads all their stored spans, and derives per trace (derive._rules.derive_trace). A
derived span already stored in the trace, or submitted by this pass object before, is not
submitted again; so a replayed or resent source span derives nothing twice, and a second
pass stores nothing new.

Delay from a source span's arrival to its derived transition in handoff_transitions: up to
`every_s` (the pass interval) + the pass + serve's write of the derived request.
Errors of the store or of ingest are logged, counted in `stats["errors"]` and retried at the
next pass (the cursor does not move); the thread never dies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from collector.tracer import INSTRUMENTATION_NAME, SPAN_NAME
from derive._model import Derived, SpanEvent, SpanRecord
from derive._otlp import SCOPE, encode
from derive._rules import RULES, SCOPES, Rule, derive_trace
from foundation import settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["DERIVE_EVERY_S", "DerivePass", "PassResult"]

log = logging.getLogger("handoffs.derive")

DERIVE_EVERY_S: Final = settings.DERIVE_EVERY_S
#: trace ids read per query
_CHUNK: Final = 1000
#: derived span ids remembered as submitted (the store is asked too; this covers the time
#: between a submit and its write)
_REMEMBER: Final = 200_000

_TOUCHED_SQL: Final = """
SELECT Tenant, TraceId
FROM {db}.otel_traces
WHERE InsertedAt >= {{since:DateTime}} AND InsertedAt <= {{until:DateTime}}
  AND Timestamp >= {{oldest:DateTime64(9)}}
  AND (ScopeName IN {{scopes:Array(String)}}
       OR startsWith(SpanName, 'invoke_agent') OR startsWith(SpanName, 'execute_tool')
       OR (ParentSpanId = '' AND ScopeName NOT IN {{own:Array(String)}}
           AND SpanName NOT IN {{transitions:Array(String)}}))
GROUP BY Tenant, TraceId
"""

_SPANS_SQL: Final = """
SELECT Tenant, TraceId, SpanId, ParentSpanId, SpanName,
       toUnixTimestamp64Nano(Timestamp) AS start_ns, Duration, StatusCode, StatusMessage,
       ScopeName, ServiceName, SpanAttributes, `Events.Name`,
       arrayMap(a -> a['exception.type'], `Events.Attributes`) AS exception_types
FROM {db}.otel_traces
WHERE TraceId IN {{ids:Array(String)}} AND Timestamp >= {{oldest:DateTime64(9)}}
"""


@dataclass(frozen=True, slots=True)
class PassResult:
    """One pass: traces read, spans read, derived transitions submitted, seconds taken."""

    traces: int
    spans: int
    submitted: int
    seconds: float


def _record(row: Sequence[Any]) -> SpanRecord:
    tenant, tid, sid, psid, name, start, dur, status, msg, scope, service, attrs, evs, exc = row
    events = tuple(
        SpanEvent(n, 0, {"exception.type": t} if t else {}) for n, t in zip(evs, exc, strict=False)
    )
    return SpanRecord(
        trace_id=tid,
        span_id=sid,
        parent_span_id=psid,
        name=name,
        start_ns=int(start),
        end_ns=int(start) + int(dur),
        status=status,
        status_message=msg,
        scope=scope,
        service_name=service,
        attributes=attrs,
        events=events,
        tenant=tenant or "default",
    )


def new_transitions(spans: Iterable[SpanRecord], rules: Iterable[Rule] = RULES) -> list[Derived]:
    """What one trace's stored spans derive that is not stored already (pure)."""
    spans = list(spans)
    stored = {s.span_id for s in spans if s.is_derived}
    return [d for d in derive_trace(spans, rules) if d.span_id not in stored]


class DerivePass:
    """The pass (module doc) and its thread: `run_once()`, or `start()` / `stop()`; `stats`
    counts passes, traces and spans read, transitions submitted and failed passes, also as a
    prometheus-client collector (`collect`).

    `connect`: opens a client on the store. `submit(body, tenant)`: ingests one OTLP/protobuf
    request (serve: Ingestor.submit). `every_s`: seconds between passes. `trace_window_s`: a
    trace's spans older than this (by span time) are not read. `clock` -> seconds since the
    epoch. Raises ValueError on a non-positive interval or window.
    """

    def __init__(
        self,
        connect: Callable[[], Client],
        database: str,
        submit: Callable[[bytes, str], object],
        *,
        every_s: float = 2.0,
        trace_window_s: float = 3600.0,
        rules: Iterable[Rule] = RULES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if every_s <= 0 or trace_window_s <= 0:
            raise ValueError("every_s and trace_window_s must be more than 0 seconds")
        self._connect = connect
        self._db = database
        self._submit = submit
        self.every_s = every_s
        self._window = trace_window_s
        self._rules = tuple(rules)
        self._clock = clock
        self._cursor = int(clock() - trace_window_s)
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._client: Client | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"passes": 0, "traces": 0, "spans": 0, "submitted": 0, "errors": 0}
        self.last_s = 0.0  # seconds the last pass took

    def run_once(self) -> PassResult:
        """One pass; raises what the store or ingest raised (the cursor then stays)."""
        t0 = time.perf_counter()
        if self._client is None:
            self._client = self._connect()
        c = self._client
        until = int(self._clock())
        oldest = datetime.fromtimestamp(self._clock() - self._window, UTC)
        touched = c.query(
            _TOUCHED_SQL.format(db=self._db),
            parameters={
                "since": datetime.fromtimestamp(self._cursor, UTC),
                "until": datetime.fromtimestamp(until, UTC) + timedelta(seconds=1),
                "oldest": oldest,
                "scopes": list(SCOPES),
                "own": [INSTRUMENTATION_NAME, SCOPE],
                "transitions": sorted(SPAN_NAME.values()),
            },
        ).result_rows
        ids = sorted({tid for _, tid in touched})
        spans = submitted = 0
        for i in range(0, len(ids), _CHUNK):
            by_trace: dict[str, list[SpanRecord]] = {}
            rows = c.query(
                _SPANS_SQL.format(db=self._db),
                parameters={"ids": ids[i : i + _CHUNK], "oldest": oldest},
            ).result_rows
            for row in rows:
                by_trace.setdefault(row[1], []).append(_record(row))
            spans += len(rows)
            fresh: dict[str, list[Derived]] = {}
            for trace_spans in by_trace.values():
                for d in new_transitions(trace_spans, self._rules):
                    if d.span_id not in self._sent:
                        fresh.setdefault(d.tenant, []).append(d)
            for tenant, items in fresh.items():
                self._submit(encode(items), tenant)
                for d in items:
                    self._sent[d.span_id] = None
                submitted += len(items)
        while len(self._sent) > _REMEMBER:
            self._sent.popitem(last=False)
        self._cursor = until  # that second is read again next time: arrivals may follow
        result = PassResult(len(ids), spans, submitted, time.perf_counter() - t0)
        self.stats["passes"] += 1
        self.stats["traces"] += result.traces
        self.stats["spans"] += result.spans
        self.stats["submitted"] += result.submitted
        self.last_s = result.seconds
        return result

    def collect(self) -> Iterator[Any]:
        """prometheus-client collector: the pass counters (register on serve's /metrics)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.stats
        for key, doc in (
            ("passes", "derivation passes run"),
            ("traces", "traces read by derivation passes"),
            ("spans", "spans read by derivation passes"),
            ("submitted", "derived transitions submitted to ingest"),
            ("errors", "derivation passes that failed (retried at the next pass)"),
        ):
            yield CounterMetricFamily(f"handoffs_derive_{key}", doc, value=st[key])
        yield GaugeMetricFamily(
            "handoffs_derive_last_pass_seconds", "duration of the last pass", value=self.last_s
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="derive", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the running pass; close the client. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                r = self.run_once()
                if r.submitted:
                    log.info("derive: %d transition(s) from %d trace(s), %.3f s",
                             r.submitted, r.traces, r.seconds)  # fmt: skip
            except Exception:
                self.stats["errors"] += 1
                log.exception("derive: pass failed; retried in %g s", self.every_s)
                if self._client is not None:
                    try:
                        self._client.close()
                    except Exception:
                        log.debug("derive: closing the client failed", exc_info=True)
                    self._client = None
