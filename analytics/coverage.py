"""Blind spots: traces in which two or more agents ran and from which no handoff was derived.

serve's derivation pass keeps a verdict per (tenant, trace) with two or more distinct agents
in `blind_spots` (sql/016, derive._blind): blind when no rule derived a handoff from it and it
holds no transition of the shim or an adapter. Such a trace comes from a framework (or a
shape of one) no rule knows: its handoffs are in no funnel, so an empty funnel is not a
healthy one. Definitions: docs/derived-handoffs.md, "Blind spots".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.cohort import Window, check_db

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["BlindSpots", "blind_spots"]

#: agents listed per (tenant, scope) at most
_AGENTS: Final = 50

# the latest verdict of each (tenant, trace) that began in the window, by argMax over
# `updated` rather than FINAL, so a trace judged blind and derived later is never counted
# whatever the engine's FINAL/PREWHERE settings; the IN subquery limits the merge to the
# traces with a verdict in the window
_SQL: Final = """
SELECT tenant, sc, count() AS traces,
       arrayMap(x -> x.2, arraySlice(arrayReverseSort(groupArray((last, trace_id))),
                                     1, {{examples:UInt32}})) AS examples,
       arraySort(groupUniqArrayArray({agents})(names)) AS agents,
       max(last) AS last_seen
FROM (
    SELECT tenant, trace_id, argMax(scope, updated) AS sc, argMax(agents, updated) AS names,
           argMax(first_seen, updated) AS first, argMax(last_seen, updated) AS last,
           argMax(blind, updated) AS is_blind
    FROM {db}.blind_spots
    WHERE ({{tenant:String}} = '' OR tenant = {{tenant:String}})
      AND (tenant, trace_id) IN (
          SELECT tenant, trace_id FROM {db}.blind_spots
          WHERE first_seen >= {{start:DateTime64(9)}} AND first_seen < {{end:DateTime64(9)}}
            AND ({{tenant:String}} = '' OR tenant = {{tenant:String}}))
    GROUP BY tenant, trace_id
)
WHERE is_blind AND first >= {{start:DateTime64(9)}} AND first < {{end:DateTime64(9)}}
GROUP BY tenant, sc
ORDER BY tenant, traces DESC, sc
"""


@dataclass(frozen=True, slots=True)
class BlindSpots:
    """One tenant's blind-spot traces of one instrumentation scope: `traces` (count),
    `examples` the trace ids of the latest (by last span end, newest first), `agents` the
    distinct agents named in them (sorted, at most 50), `last_seen` the latest span end."""

    tenant: str
    scope: str
    traces: int
    examples: tuple[str, ...]
    agents: tuple[str, ...]
    last_seen: Any

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `handoffs blind-spots --json` (last_seen ISO-8601 UTC)."""
        return {
            "tenant": self.tenant,
            "scope": self.scope,
            "traces": self.traces,
            "examples": list(self.examples),
            "agents": list(self.agents),
            "last_seen": self.last_seen.isoformat().replace("+00:00", "Z"),
        }


def blind_spots(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    examples: int = 3,
) -> list[BlindSpots]:
    """Per tenant and scope, the blind-spot traces whose first span started in
    [window.start, window.end) (the window's as_of is not used: a verdict is as the pass
    last judged it). Sorted by tenant, then traces descending, then scope; [] when none.
    ValueError for examples < 0 or a database name that is not an identifier."""
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    db = check_db(database)
    rows = client.query(
        _SQL.format(db=db, agents=_AGENTS),
        parameters={
            "start": window.start,
            "end": window.end,
            "tenant": tenant or "",
            "examples": examples,
        },
    ).result_rows
    return [
        BlindSpots(
            tenant=t,
            scope=s,
            traces=int(n),
            examples=tuple(ex),
            agents=tuple(ag),
            last_seen=last,
        )
        for t, s, n, ex, ag, last in rows
    ]
