"""The derivation pass: read spans of recently touched traces, run the rules, submit what is
new through serve's normal ingest path (validation, spool, dedup, ledger).

A handoff's spans and its target agent's spans arrive in different OTLP requests, so a pass
works on whole stored traces, not on one request, and on one tenant's spans of a trace at a
time: work is keyed by (tenant, trace id) (trace ids cross organisations by design), so
another tenant's spans in the same trace id neither feed a derivation nor suppress it.
Each pass finds the (tenant, trace id) pairs whose tenant stored a span a rule may read
since its cursor (`otel_traces.InsertedAt`, whole seconds, read from `LATE_S` seconds before
it: a row's InsertedAt is taken when its insert starts, and a slow insert shows its rows
later; a pair whose span count has not changed since it was derived is not derived again): a span of an instrumentation scope in
derive._rules.SCOPES, a GenAI span named `invoke_agent ...` or `execute_tool ...` (as the
conventions name them), or a root span not of the shim's or derivation's own scope and not
named as a handoff transition (`handoff.<event>`, as the shim names them: another exporter's
transitions, e.g. an OTel SDK in Node, are often roots, and reading their traces derives
nothing). That test reads plain columns, never the attribute map, so heavy handoff traffic
costs only a column scan of the rows stored since the last pass. The same query counts each
pair's stored spans. The pairs join per-tenant queues (derive._schedule); the pass reads them
in fair turns, one tenant's spans of its traces per query, and derives per (tenant, trace)
(`derive_held`); what its span budget leaves waits for the next pass, in memory (a
restarted serve reads the whole trace window again). A handoff whose source span has an
ancestor not stored yet is held (derive._rules.Hold): the enclosing runs, which name its cause,
come in a later request; its trace is read again each pass until they are stored or `hold_s`
seconds have passed since the source was stored. A derived span already stored in the
tenant's trace, or submitted by this pass object for that tenant before, is not submitted
again; so a replayed or resent source span derives nothing twice, and a second pass stores
nothing new.

Delay from a source span's arrival to its derived transition in handoff_transitions: up to
`every_s` (the pass interval) + the pass + serve's write of the derived request, when no
tenant's work waits for a later pass and the spans enclosing the handoff are stored; up to
`hold_s` more while they are not. Errors of the store or of ingest are logged, counted in
`stats["errors"]` and retried at the next pass (the cursor and the queues do not move); the
thread never dies.
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
from derive._blind import BlindSpotLog, verdicts
from derive._model import Derived, SpanEvent, SpanRecord
from derive._otlp import SCOPE, encode
from derive._rules import RULES, SCOPES, Hold, Rule, derivation
from derive._schedule import Backlog, TraceKey, Turn, Work, enqueue, plan_pass
from foundation import settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "DERIVE_EVERY_S",
    "DERIVE_HOLD_S",
    "HOLD_S",
    "PASS_SPANS",
    "TURN_SPANS",
    "DerivePass",
    "PassResult",
    "derive_traces",
    "new_transitions",
]

log = logging.getLogger("handoffs.derive")

DERIVE_EVERY_S: Final = settings.DERIVE_EVERY_S
#: trace ids read per query
_CHUNK: Final = 1000
#: derived span ids remembered as submitted (the store is asked too; this covers the time
#: between a submit and its write)
_REMEMBER: Final = 200_000

#: spans of one tenant a turn reads at most (or one trace, when that alone is larger)
TURN_SPANS: Final = 20_000
#: a pass starts no turn once it has read this many spans; the rest waits for the next pass
PASS_SPANS: Final = 200_000
DERIVE_HOLD_S: Final = settings.DERIVE_HOLD_S
#: seconds a handoff whose enclosing spans are not stored yet waits for them (derive._rules.Hold)
HOLD_S: Final = float(DERIVE_HOLD_S.default)
#: seconds a stored row may become visible after its InsertedAt (now() is taken when its
#: insert starts, the row is seen when the insert ends): the cursor reads this far back, and
#: a trace whose span count has not changed since it was derived is not derived again
LATE_S: Final = 30

#: a row a rule may read, stored since the cursor (module doc)
_TOUCHES: Final = """InsertedAt >= {since:DateTime} AND InsertedAt <= {until:DateTime}
  AND (ScopeName IN {scopes:Array(String)}
       OR startsWith(SpanName, 'invoke_agent') OR startsWith(SpanName, 'execute_tool')
       OR (ParentSpanId = '' AND ScopeName NOT IN {own:Array(String)}
           AND SpanName NOT IN {transitions:Array(String)}))"""

# (tenant, trace id) pairs whose own tenant's rows touched them, with the pair's span count
# (the rows the spans query reads); the TraceId subquery lets the bloom filter skip granules
_TOUCHED_SQL: Final = """
SELECT Tenant, TraceId, count() AS spans
FROM {db}.otel_traces
WHERE Timestamp >= {{oldest:DateTime64(9)}}
  AND TraceId IN (SELECT TraceId FROM {db}.otel_traces
                  WHERE Timestamp >= {{oldest:DateTime64(9)}} AND {touches})
GROUP BY Tenant, TraceId
HAVING countIf({touches}) > 0
"""

# one tenant's spans of some traces: another tenant's spans in the same trace id are not read
_SPANS_SQL: Final = """
SELECT Tenant, TraceId, SpanId, ParentSpanId, SpanName,
       toUnixTimestamp64Nano(Timestamp) AS start_ns, Duration, StatusCode, StatusMessage,
       ScopeName, ServiceName, SpanAttributes, `Events.Name`,
       arrayMap(a -> a['exception.type'], `Events.Attributes`) AS exception_types,
       `Links.TraceId`, `Links.SpanId`, toUnixTimestamp(InsertedAt) AS stored_s
FROM {db}.otel_traces
WHERE Tenant = {{tenant:String}} AND TraceId IN {{ids:Array(String)}}
  AND Timestamp >= {{oldest:DateTime64(9)}}
"""


@dataclass(frozen=True, slots=True)
class PassResult:
    """One pass: (tenant, trace) pairs read, spans read, derived transitions submitted,
    seconds taken, and (tenant, trace) pairs left waiting for the next pass (its span budget
    left them, or a handoff in them is held)."""

    traces: int
    spans: int
    submitted: int
    seconds: float
    waiting: int = 0


def _record(row: Sequence[Any]) -> SpanRecord:
    (tenant, tid, sid, psid, name, start, dur, status, msg, scope, service, attrs, evs, exc,
     link_tids, link_sids, stored) = row  # fmt: skip
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
        links=tuple(zip(link_tids, link_sids, strict=False)),
        stored_s=int(stored),
    )


def new_transitions(spans: Iterable[SpanRecord], rules: Iterable[Rule] = RULES) -> list[Derived]:
    """What one tenant's stored spans of one trace derive that is not stored already (pure).
    Raises ValueError on spans of more than one (tenant, trace id)."""
    spans = list(spans)
    stored = {s.span_id for s in spans if s.is_derived}
    return [d for d in derivation(spans, rules).transitions if d.span_id not in stored]


def derive_traces(spans: Iterable[SpanRecord], rules: Iterable[Rule] = RULES) -> list[Derived]:
    """`new_transitions` of each (tenant, trace id) among `spans`, in first-seen order (pure):
    another tenant's spans in the same trace id neither feed nor suppress a derivation."""
    return derive_held(spans, rules, None)[0]


def derive_held(
    spans: Iterable[SpanRecord], rules: Iterable[Rule], hold: Hold | None
) -> tuple[list[Derived], frozenset[TraceKey]]:
    """`derive_traces` under `hold` (pure): the transitions not stored already, and the
    (tenant, trace id) pairs in which `hold` held a handoff (to be read again)."""
    groups: dict[TraceKey, list[SpanRecord]] = {}
    for s in spans:
        groups.setdefault(TraceKey(s.tenant, s.trace_id), []).append(s)
    out: list[Derived] = []
    held: set[TraceKey] = set()
    for key, group in groups.items():
        stored = {s.span_id for s in group if s.is_derived}
        d = derivation(group, rules, hold)
        out += [t for t in d.transitions if t.span_id not in stored]
        if d.held:
            held.add(key)
    return out, frozenset(held)


class DerivePass:
    """The pass (module doc) and its thread: `run_once()`, or `start()` / `stop()`; `stats`
    counts passes, (tenant, trace) pairs and spans read, transitions submitted and failed
    passes, also as a prometheus-client collector (`collect`, with `waiting`: pairs the last
    pass left for the next).

    `connect`: opens a client on the store. `submit(body, tenant)`: ingests one OTLP/protobuf
    request (serve: Ingestor.submit). `every_s`: seconds between passes. `trace_window_s`: a
    trace's spans older than this (by span time) are not read. `clock` -> seconds since the
    epoch. `turn_spans`, `pass_spans`: the fairness budget (derive._schedule): spans of one
    tenant a turn reads at most (or one trace, when larger), and spans after which a pass
    starts no more turns. `hold_s`: seconds a handoff waits for its enclosing spans
    (derive._rules.Hold; 0: never). Raises ValueError on a non-positive interval, window or
    budget, or a negative hold.
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
        turn_spans: int = TURN_SPANS,
        pass_spans: int = PASS_SPANS,
        hold_s: float = HOLD_S,
    ) -> None:
        if every_s <= 0 or trace_window_s <= 0:
            raise ValueError("every_s and trace_window_s must be more than 0 seconds")
        if hold_s < 0:
            raise ValueError("hold_s must be 0 seconds or more")
        self._hold_s = hold_s
        plan_pass(Backlog(), turn_spans=turn_spans, pass_spans=pass_spans)  # checks them
        self._turn_spans = turn_spans
        self._pass_spans = pass_spans
        self._backlog = Backlog()
        self._connect = connect
        self._db = database
        self._submit = submit
        self.every_s = every_s
        self._window = trace_window_s
        self._rules = tuple(rules)
        self._clock = clock
        self._cursor = int(clock() - trace_window_s)
        self._sent: OrderedDict[tuple[str, str], None] = OrderedDict()  # (tenant, span id)
        # (tenant, trace) -> its span count when last derived with nothing held (LATE_S)
        self._read: OrderedDict[TraceKey, int] = OrderedDict()
        self._blind = BlindSpotLog(database, clock=clock)  # traces no rule derives (_blind)
        self._client: Client | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"passes": 0, "traces": 0, "spans": 0, "submitted": 0, "errors": 0}
        self.waiting = 0  # (tenant, trace) pairs left for the next pass by the last one
        self.last_s = 0.0  # seconds the last pass took

    def run_once(self) -> PassResult:
        """One pass; raises what the store or ingest raised (the cursor and the queues then
        stay: the next pass reads the same work again)."""
        t0 = time.perf_counter()
        if self._client is None:
            self._client = self._connect()
        c = self._client
        until = int(self._clock())
        oldest = datetime.fromtimestamp(self._clock() - self._window, UTC)
        touched = c.query(
            _TOUCHED_SQL.format(db=self._db, touches=_TOUCHES),
            parameters={
                "since": datetime.fromtimestamp(self._cursor - LATE_S, UTC),
                "until": datetime.fromtimestamp(until, UTC) + timedelta(seconds=1),
                "oldest": oldest,
                "scopes": list(SCOPES),
                "own": [INSTRUMENTATION_NAME, SCOPE],
                "transitions": sorted(SPAN_NAME.values()),
            },
        ).result_rows
        work = sorted(
            (w for w in (Work(TraceKey(t, tid), int(n)) for t, tid, n in touched)
             if self._read.get(w.key) != w.spans),  # a trace with no new span: derived
            key=lambda w: w.key,
        )  # fmt: skip
        plan = plan_pass(
            enqueue(self._backlog, work), turn_spans=self._turn_spans, pass_spans=self._pass_spans
        )
        hold = Hold(self._clock(), self._hold_s)
        spans = submitted = 0
        again: list[Work] = []
        for turn in plan.turns:
            read, sent, held = self._run_turn(c, turn, oldest, hold)
            spans += read
            submitted += sent
            again += held
        for memo in (self._sent, self._read):
            while len(memo) > _REMEMBER:
                memo.popitem(last=False)
        # what the budget left waits, ahead of what arrives later; a held handoff's trace after
        self._backlog = enqueue(plan.rest, again)
        self._cursor = until  # that second is read again next time: arrivals may follow
        traces = sum(len(t.work) for t in plan.turns)
        result = PassResult(
            traces, spans, submitted, time.perf_counter() - t0, self._backlog.traces
        )
        self.stats["passes"] += 1
        self.stats["traces"] += result.traces
        self.stats["spans"] += result.spans
        self.stats["submitted"] += result.submitted
        self.waiting = result.waiting
        self.last_s = result.seconds
        return result

    def _run_turn(
        self, c: Client, turn: Turn, oldest: datetime, hold: Hold
    ) -> tuple[int, int, list[Work]]:
        """Read, derive and submit one tenant's turn; (spans read, transitions submitted, the
        traces in which a handoff was held, to be read again)."""
        ids = [w.key.trace_id for w in turn.work]
        spans = submitted = 0
        again: list[Work] = []
        for i in range(0, len(ids), _CHUNK):
            rows = c.query(
                _SPANS_SQL.format(db=self._db),
                parameters={"tenant": turn.tenant, "ids": ids[i : i + _CHUNK], "oldest": oldest},
            ).result_rows
            spans += len(rows)
            records = [_record(r) for r in rows]
            derived, held_keys = derive_held(records, self._rules, hold)
            held = {k.trace_id for k in held_keys}  # one tenant's turn: the trace id says which
            counts: dict[str, int] = {}
            for r in records:
                counts[r.trace_id] = counts.get(r.trace_id, 0) + 1
            fresh: dict[str, list[Derived]] = {}
            for d in derived:
                if (d.tenant, d.span_id) not in self._sent:
                    fresh.setdefault(d.tenant, []).append(d)
            for tenant, items in fresh.items():
                self._submit(encode(items), tenant)
                for d in items:
                    self._sent[(d.tenant, d.span_id)] = None
                submitted += len(items)
            judged = [r for r in records if r.trace_id not in held]  # held: judged when derived
            self._blind.write(c, verdicts(judged, derived))  # multi-agent traces (_blind)
            for tid, n in counts.items():
                key = TraceKey(turn.tenant, tid)
                if tid in held:
                    self._read.pop(key, None)
                    again.append(Work(key, n))
                else:
                    self._read[key] = n
                    self._read.move_to_end(key)
        return spans, submitted, again

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
        yield GaugeMetricFamily(
            "handoffs_derive_waiting_traces",
            "(tenant, trace) pairs the last pass left for the next (its span budget, or a held handoff)",
            value=self.waiting,
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
