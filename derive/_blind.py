"""Blind spots: traces in which several agents ran and from which no handoff was derived.

A team whose framework no rule knows would otherwise see an empty funnel that looks healthy.
So the pass judges every (tenant, trace) it reads: the distinct agents its spans name
(`agents`), and whether it is a blind spot (`is_blind`): two or more agents, nothing derived
from it, and no handoff transition stored in it (the shim's, an adapter's or derivation's).
The pure parts (`agents`, `agent_scope`, `is_blind`, `judge`, `verdicts`) take frozen span
records; `BlindSpotLog` keeps the verdicts in the `blind_spots` table (sql/016), writing a
(tenant, trace) again only when its verdict changes, so a trace judged blind and derived
later drops out (ReplacingMergeTree by `updated`: the latest verdict wins).

An agent is named by, in this order on one span: `gen_ai.agent.name` (OTel GenAI; Strands,
ADK, OpenLLMetry), OpenInference's `agent.name` or `graph.node.id`, the GenAI span name
`invoke_agent <name>`, or Microsoft Agent Framework's `executor.process <executor>` (its
`executor.id`). Limits: an agent used as a tool by another (no handoff by design) makes a
blind spot too; a framework naming agents none of these ways is not seen at all.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from derive._model import Derived, SpanRecord

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "AGENT_ATTRIBUTES",
    "TABLE",
    "BlindSpotLog",
    "Verdict",
    "agent_of",
    "agent_scope",
    "agents",
    "is_blind",
    "judge",
    "verdicts",
]

#: span attributes that name the agent a span belongs to, first match wins
AGENT_ATTRIBUTES: Final = ("gen_ai.agent.name", "agent.name", "graph.node.id")
#: span name prefixes followed by the agent's name (GenAI / Strands; Microsoft Agent Framework)
_NAME_PREFIXES: Final = ("invoke_agent ", "executor.process ")
_EXECUTOR_ID: Final = "executor.id"
#: the table the verdicts are kept in (sql/016_blind_spots.sql)
TABLE: Final = "blind_spots"
#: verdicts remembered as written (a restarted serve writes each one it reads again, once)
_REMEMBER: Final = 200_000
_COLUMNS: Final = (
    "tenant", "trace_id", "scope", "agents", "first_seen", "last_seen", "blind", "updated"
)  # fmt: skip


def agent_of(span: SpanRecord) -> str | None:
    """The agent `span` names (module doc), or None. A name is stripped; empty is none."""
    for key in AGENT_ATTRIBUTES:
        name = span.attr(key).strip()
        if name:
            return name
    for prefix in _NAME_PREFIXES:
        if span.name.startswith(prefix):
            name = span.name[len(prefix) :].strip()
            if prefix == "executor.process ":
                name = span.attr(_EXECUTOR_ID).strip() or name
            if name:
                return name
    return None


def agents(spans: Iterable[SpanRecord]) -> tuple[str, ...]:
    """The distinct agents the spans name, sorted."""
    return tuple(sorted({a for s in spans if (a := agent_of(s)) is not None}))


def agent_scope(spans: Iterable[SpanRecord]) -> str:
    """The instrumentation scope of the spans that name agents: the most frequent (ties: the
    smallest name); "" when none names one."""
    counts = Counter(s.scope for s in spans if agent_of(s) is not None)
    if not counts:
        return ""
    return min(counts, key=lambda scope: (-counts[scope], scope))


def is_blind(agent_count: int, derived: bool, has_transitions: bool) -> bool:
    """A blind spot: two or more distinct agents ran, nothing was derived from the trace and it
    holds no handoff transition (shim, adapter or derived)."""
    return agent_count >= 2 and not derived and not has_transitions


@dataclass(frozen=True, slots=True)
class Verdict:
    """One (tenant, trace) judged: its agents (sorted), their scope (`agent_scope`), the
    earliest span start and latest span end (ns since the epoch), and whether it is blind."""

    tenant: str
    trace_id: str
    scope: str
    agents: tuple[str, ...]
    first_ns: int
    last_ns: int
    blind: bool


def judge(spans: Sequence[SpanRecord], derived: bool) -> Verdict | None:
    """The verdict of one tenant's spans of one trace, given whether the rules derived a
    transition from them now; None when fewer than two agents ran (nothing to report, nothing
    to take back). Raises ValueError on spans of more than one (tenant, trace id) or none."""
    keys = {(s.tenant, s.trace_id) for s in spans}
    if len(keys) != 1:
        raise ValueError(f"spans of exactly one (tenant, trace id) needed, got {len(keys)}")
    names = agents(spans)
    if len(names) < 2:
        return None
    ((tenant, trace_id),) = keys
    return Verdict(
        tenant=tenant,
        trace_id=trace_id,
        scope=agent_scope(spans),
        agents=names,
        first_ns=min(s.start_ns for s in spans),
        last_ns=max(max(s.end_ns, s.start_ns) for s in spans),
        blind=is_blind(len(names), derived, any(s.is_handoff for s in spans)),
    )


def verdicts(spans: Iterable[SpanRecord], derived: Iterable[Derived]) -> list[Verdict]:
    """`judge` of each (tenant, trace id) among `spans` (first-seen order) that had two or more
    agents; `derived`: what the rules derived from these spans now (new or already stored)."""
    made = {(d.tenant, d.trace_id) for d in derived}
    groups: dict[tuple[str, str], list[SpanRecord]] = {}
    for s in spans:
        groups.setdefault((s.tenant, s.trace_id), []).append(s)
    return [v for key, g in groups.items() if (v := judge(g, key in made)) is not None]


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


class BlindSpotLog:
    """Writes verdicts into `{database}.blind_spots`, each (tenant, trace) only when its
    verdict (blind, agents, scope) differs from the last written by this object; a restarted
    serve writes each it reads once more (the table keeps the latest by `updated`). Used by
    the derivation thread only (no lock). `clock`: seconds since the epoch (the row's
    `updated`)."""

    def __init__(self, database: str, *, clock: Callable[[], float]) -> None:
        self._db = database
        self._clock = clock
        self._written: OrderedDict[tuple[str, str], tuple[bool, tuple[str, ...], str]] = (
            OrderedDict()
        )

    def changed(self, found: Iterable[Verdict]) -> list[Verdict]:
        """The verdicts not written already as they are."""
        return [
            v
            for v in found
            if self._written.get((v.tenant, v.trace_id)) != (v.blind, v.agents, v.scope)
        ]

    def write(self, client: Client, found: Iterable[Verdict]) -> int:
        """Insert the changed verdicts (one insert); how many rows were written. Raises what
        the store raises (nothing is remembered then: the next pass writes them again)."""
        rows = self.changed(found)
        if not rows:
            return 0
        updated = datetime.fromtimestamp(self._clock(), UTC)
        client.insert(
            TABLE,
            [
                [
                    v.tenant,
                    v.trace_id,
                    v.scope,
                    list(v.agents),
                    _time(v.first_ns),
                    _time(v.last_ns),
                    v.blind,
                    updated,
                ]
                for v in rows
            ],
            database=self._db,
            column_names=list(_COLUMNS),
        )
        for v in rows:
            self._written[(v.tenant, v.trace_id)] = (v.blind, v.agents, v.scope)
            self._written.move_to_end((v.tenant, v.trace_id))
        while len(self._written) > _REMEMBER:
            self._written.popitem(last=False)
        return len(rows)
