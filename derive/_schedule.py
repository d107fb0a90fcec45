"""Which traces a derivation pass reads, tenant by tenant. Pure: frozen values in, frozen
values out; derive._pass does the reading.

Work is keyed by (tenant, trace id): trace ids cross organisations by design (a W3C
traceparent passed over A2A), so one trace id may hold spans of several tenants, and each
tenant's spans are read and derived apart from the others'.

Fairness: the traces waiting to be read sit in one queue per tenant, in the order they were
touched. A pass serves the tenants in turns, round robin (in tenant order, starting after the
tenant served last, also across passes). A turn takes the tenant's waiting traces in order
while their spans stay within `turn_spans`, and at least one trace (a trace is derived
whole, so one larger than `turn_spans` is a turn of its own). Turns go on while the pass
has read fewer than `pass_spans` spans; what is not taken waits, in order, for the next
pass. So a pass reads at most `turn_spans` spans of one tenant (or its one next trace, when
that alone is larger) before every other tenant with waiting traces has had its turn, and
at most `pass_spans` spans in all plus one turn. Span counts are those of the touched-traces
query; spans stored after it are read too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Backlog", "PassPlan", "TraceKey", "Turn", "Work", "enqueue", "plan_pass"]


@dataclass(frozen=True, slots=True, order=True)
class TraceKey:
    """One tenant's spans of one trace. `tenant` as stored (otel_traces.Tenant)."""

    tenant: str
    trace_id: str


@dataclass(frozen=True, slots=True)
class Work:
    """A trace to read: its key and how many spans it held when last touched."""

    key: TraceKey
    spans: int


@dataclass(frozen=True, slots=True)
class Backlog:
    """The traces waiting to be read: per tenant (in tenant order) its queue, oldest touch
    first; `last`: the tenant whose turn came last (the next round starts after it)."""

    queues: tuple[tuple[str, tuple[Work, ...]], ...] = ()
    last: str | None = None

    @property
    def traces(self) -> int:
        return sum(len(q) for _, q in self.queues)

    @property
    def spans(self) -> int:
        return sum(w.spans for _, q in self.queues for w in q)


@dataclass(frozen=True, slots=True)
class Turn:
    """One tenant's turn in a pass: the traces it reads, in order."""

    tenant: str
    work: tuple[Work, ...]

    @property
    def spans(self) -> int:
        return sum(w.spans for w in self.work)


@dataclass(frozen=True, slots=True)
class PassPlan:
    """The turns of one pass, in order, and what waits for the next pass."""

    turns: tuple[Turn, ...]
    rest: Backlog

    @property
    def spans(self) -> int:
        return sum(t.spans for t in self.turns)


def enqueue(backlog: Backlog, touched: Iterable[Work]) -> Backlog:
    """`backlog` with the traces `touched` added: a trace already waiting keeps its place and
    takes the newer span count; a new one joins the end of its tenant's queue, in the order
    given (a key given twice: its last count)."""
    queues: dict[str, dict[TraceKey, Work]] = {t: {w.key: w for w in q} for t, q in backlog.queues}
    for w in touched:
        queues.setdefault(w.key.tenant, {})[w.key] = w
    return Backlog(
        tuple((t, tuple(queues[t].values())) for t in sorted(queues) if queues[t]), backlog.last
    )


def plan_pass(backlog: Backlog, *, turn_spans: int, pass_spans: int) -> PassPlan:
    """The turns of one pass over `backlog` (module doc: round robin, at most `turn_spans`
    spans a turn or one trace, turns while fewer than `pass_spans` spans are read). Raises
    ValueError when a limit is under 1 span."""
    if turn_spans < 1 or pass_spans < 1:
        raise ValueError("turn_spans and pass_spans must be at least 1 span")
    tenants = [t for t, _ in backlog.queues]
    queues = dict(backlog.queues)
    at = dict.fromkeys(tenants, 0)  # per tenant: its first trace not taken yet
    # the round starts after the tenant served last
    start = sum(1 for t in tenants if backlog.last is not None and t <= backlog.last)
    order = tenants[start:] + tenants[:start]
    turns: list[Turn] = []
    read, last = 0, backlog.last
    waiting = bool(order)
    while read < pass_spans and waiting:
        waiting = False
        for tenant in order:
            queue, i = queues[tenant], at[tenant]
            if i == len(queue) or read >= pass_spans:
                continue
            j, spans = i + 1, queue[i].spans
            while j < len(queue) and spans + queue[j].spans <= turn_spans:
                spans += queue[j].spans
                j += 1
            turns.append(Turn(tenant, queue[i:j]))
            at[tenant], read, last = j, read + spans, tenant
            waiting = waiting or j < len(queue)
    rest = tuple((t, queues[t][at[t] :]) for t in tenants if at[t] < len(queues[t]))
    return PassPlan(tuple(turns), Backlog(rest, last))
