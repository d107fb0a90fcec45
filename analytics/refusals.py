"""Why handoffs are refused or fail: the error codes of every refusal event of the cohort.

A refusal event is a counted transition (legal under the contract, not flagged
valid=false) of one of REFUSAL_EVENTS: `reject` (created -> rejected), `fail` (running or
prepared -> failed), `timeout` (-> unknown), `expire` (created -> expired) and `cancel`
(-> canceled); semconv documents `handoff.error_code` on reject, fail and timeout, and an
expire or cancel row that carries one is read the same way (none: the empty code). Per
cohort handoff and event, the code of its earliest counted row of that event (time, then
span id). Codes outside semconv.ERROR_CODES (the empty code included) are counted under
semconv.ERROR_CODE_OTHER with the raw codes listed. A `reject` row flagged
`handoff.valid=false` is a refused message (a receiver's strict shim, or the A2A adapter,
refusing a message the handoff's state does not allow: it changes no state) and counts as
a `reject` refusal too. `analytics.rejections` is the `reject`-only view over settled
handoffs. Definitions: docs/metrics.md "Refusals".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from analytics._sql import contract as cs
from analytics._sql.cohort import (
    DIM_COLUMNS,
    Window,
    check_db,
    check_dims,
    cohort_sql,
    dim_expr,
    settled_window,
)
from analytics.rollup import rate
from collector.semconv import ERROR_CODE_OTHER, ERROR_CODES

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["REFUSAL_EVENTS", "Refusal", "check_events", "group_refusals", "refusals"]

#: the events whose error codes `handoffs refusals` aggregates, in the order rows sort
REFUSAL_EVENTS: Final = ("reject", "fail", "timeout", "expire", "cancel")
_VOCABULARY: Final = frozenset(ERROR_CODES)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One (event, error code) of one group when sliced: `count` cohort handoffs with a
    counted `event` row whose earliest such row carries the code; share_of_event = count /
    cohort handoffs of the group with that event, share_of_handoffs = count / cohort
    handoffs of the group (fractions 0..1, NaN when the denominator is 0); `examples` the
    smallest handoff ids; `raw_codes` the codes as sent ("" for none)."""

    event: str
    error_code: str
    count: int
    share_of_event: float
    share_of_handoffs: float
    examples: tuple[str, ...]
    raw_codes: tuple[str, ...]
    group: str | None = None

    def to_dict(self, by: str | None = None) -> dict[str, Any]:
        """The JSON object of `handoffs refusals --json` (the group under the name `by`)."""
        out: dict[str, Any] = {} if by is None else {by: self.group}
        out.update(
            event=self.event,
            error_code=self.error_code,
            count=self.count,
            share_of_event=self.share_of_event,
            share_of_handoffs=self.share_of_handoffs,
            examples=list(self.examples),
            raw_codes=list(self.raw_codes),
        )
        return out


def check_events(events: Iterable[str] | str | None) -> tuple[str, ...]:
    """The events asked for (comma-separated text or names), in REFUSAL_EVENTS order; None or
    empty = all of them. ValueError for an event outside REFUSAL_EVENTS."""
    if events is None:
        return REFUSAL_EVENTS
    names = events.split(",") if isinstance(events, str) else list(events)
    asked = {e.strip() for e in names if e.strip()}
    bad = sorted(asked - set(REFUSAL_EVENTS))
    if bad:
        raise ValueError(
            f"unknown refusal event(s) {', '.join(bad)}; choose from {', '.join(REFUSAL_EVENTS)}"
        )
    return tuple(e for e in REFUSAL_EVENTS if e in asked) or REFUSAL_EVENTS


def group_refusals(
    rows: Iterable[tuple[str | None, str, str, int, Iterable[str]]],
    handoffs: Mapping[str | None, int],
    *,
    examples: int = 3,
) -> list[Refusal]:
    """Fold (group, event, raw code, handoffs, example ids) rows into Refusals (codes outside
    ERROR_CODES under ERROR_CODE_OTHER). Sorted by group, event (REFUSAL_EVENTS order), count
    descending, code. `handoffs`: cohort handoffs per group (a group missing counts 0). Pure."""
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    acc: dict[tuple[str | None, str, str], tuple[int, set[str], set[str]]] = {}
    per_event: dict[tuple[str | None, str], int] = defaultdict(int)
    for group, event, raw, n, ids in rows:
        code = raw if raw in _VOCABULARY else ERROR_CODE_OTHER
        cnt, ex, raws = acc.get((group, event, code), (0, set(), set()))
        acc[(group, event, code)] = (cnt + int(n), ex | set(ids), raws | {raw})
        per_event[(group, event)] += int(n)
    out = [
        Refusal(
            event=event,
            error_code=code,
            count=cnt,
            share_of_event=rate(cnt, per_event[(group, event)]),
            share_of_handoffs=rate(cnt, handoffs.get(group, 0)),
            examples=tuple(sorted(ex)[:examples]),
            raw_codes=tuple(sorted(raws)),
            group=group,
        )
        for (group, event, code), (cnt, ex, raws) in acc.items()
    ]
    order = {e: i for i, e in enumerate(REFUSAL_EVENTS)}
    return sorted(
        out, key=lambda r: (r.group or "", order.get(r.event, 99), -r.count, r.error_code)
    )


def _counted(events: tuple[str, ...]) -> str:
    """SQL over handoff_transitions: the row is a counted transition of one of `events`, or
    (when `reject` is one) a refused message, a reject flagged valid=false."""
    legal = ", ".join(f"('{f}', '{e}', '{t}')" for f, e, t in cs.POSITIONS if e in events)
    refused = " OR (event = 'reject' AND NOT valid)" if "reject" in events else ""
    return f"(valid AND (from_state, event, to_state) IN ({legal})){refused}"


def refusals(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    by: str | None = None,
    events: Iterable[str] | str | None = None,
    examples: int = 3,
) -> list[Refusal]:
    """The cohort's refusal events by error code (see the module doc), for `events` (default
    all of REFUSAL_EVENTS), sliced by one dimension of DIMENSIONS when `by` is given
    (Refusal.group holds its value; `capability` counts a handoff under each capability).
    One query, no pandas. ValueError for an unknown dimension or event, or examples < 0."""
    db = check_db(database)
    dims = check_dims(() if by is None else (by,))
    evs = check_events(events)
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    extra = [c for d in dims for c in DIM_COLUMNS[d]]
    if "reject" in evs:  # a refused message is a row that does not count
        extra.append("uncounted")
    t = tenant is not None
    params: dict[str, Any] = {"tenant": tenant} if t else {}
    window = settled_window(client, db, window, tenant)
    cohort = cohort_sql(db, window, tenant_param=t, extra=extra)
    grp = dim_expr(dims[0]) if dims else "''"
    keep = max(1, 2 * int(examples))
    refused = cs.has("tmask", cs.event_mask(evs))
    if "reject" in evs:
        refused = f"({refused} OR uncounted > 0)"
    in_list = ", ".join(f"'{e}'" for e in evs)
    # one read of the cohort: per group its handoffs and the (few) refused ones, which alone
    # are joined to their refusal rows; a group without one keeps a row for its count
    sql = f"""SELECT grp, handoffs, ev, raw, countIf(handoff_id != '') AS n,
    groupArraySortedIf({keep})(handoff_id, handoff_id != '') AS ex
FROM (
    SELECT g.grp AS grp, g.handoffs AS handoffs, g.ref.2 AS handoff_id, r.event AS ev,
        r.raw AS raw
    FROM (
        SELECT grp, handoffs, ref FROM (
            SELECT {grp} AS grp, count() AS handoffs,
                groupArrayIf((tenant, handoff_id), {refused}) AS refs
            FROM ({cohort})
            GROUP BY grp
        ) LEFT ARRAY JOIN refs AS ref
    ) AS g
    LEFT JOIN (
        SELECT tenant, handoff_id, CAST(event, 'String') AS event,
            argMin(CAST(error_code, 'String'), (time, span_id)) AS raw
        FROM {db}.handoff_transitions
        PREWHERE event IN ({in_list})
        WHERE {_counted(evs)}
        GROUP BY tenant, handoff_id, event
    ) AS r ON r.tenant = g.ref.1 AND r.handoff_id = g.ref.2
)
GROUP BY grp, handoffs, ev, raw
SETTINGS join_use_nulls = 0"""
    rows = client.query(sql, parameters=params).result_rows
    key = (lambda g: str(g)) if dims else (lambda _g: None)
    handoffs = {key(g): int(n) for g, n, _ev, _raw, _n, _ex in rows}
    found = ((key(g), ev, raw, n, ex) for g, _h, ev, raw, n, ex in rows if n and ev)
    return group_refusals(found, handoffs, examples=examples)
