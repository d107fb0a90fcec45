"""Why handoffs are refused: the cohort's rejected handoffs by `handoff.error_code`.

A rejected handoff is a settled cohort handoff that reached `rejected` (created --reject-->
rejected); its code is the `error_code` of its earliest reject row (by time, then span id).
Codes outside semconv.ERROR_CODES (an empty code included) are counted together under
semconv.ERROR_CODE_OTHER, with the raw codes listed. Definitions: docs/metrics.md.
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
from analytics.metrics import rate
from collector.semconv import ERROR_CODE_OTHER, ERROR_CODES

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["Rejection", "group_codes", "rejections"]

_VOCABULARY: Final = frozenset(ERROR_CODES)
_REJECT: Final = "valid AND event = 'reject' AND from_state = 'created' AND to_state = 'rejected'"


@dataclass(frozen=True, slots=True)
class Rejection:
    """One error code (of one group when sliced): `count` rejected handoffs;
    share_of_rejections = count / rejected handoffs of the group, share_of_settled = count /
    settled handoffs of the group (fractions 0..1, NaN when the denominator is 0);
    `examples` the smallest handoff ids; `raw_codes` the codes as sent (for `other`, every
    raw code it groups, "" for none; else the code itself)."""

    error_code: str
    count: int
    share_of_rejections: float
    share_of_settled: float
    examples: tuple[str, ...]
    raw_codes: tuple[str, ...]
    group: str | None = None

    def to_dict(self, by: str | None = None) -> dict[str, Any]:
        """The JSON object of `handoffs rejections --json` (the group under the name `by`)."""
        out: dict[str, Any] = {} if by is None else {by: self.group}
        out.update(
            error_code=self.error_code,
            count=self.count,
            share_of_rejections=self.share_of_rejections,
            share_of_settled=self.share_of_settled,
            examples=list(self.examples),
            raw_codes=list(self.raw_codes),
        )
        return out


def group_codes(
    rows: Iterable[tuple[str | None, str, int, Iterable[str]]],
    settled: Mapping[str | None, int],
    *,
    examples: int = 3,
) -> list[Rejection]:
    """Fold (group, raw code, rejected handoffs, example ids) rows into Rejections: codes
    outside ERROR_CODES under ERROR_CODE_OTHER. Sorted by group, then count descending,
    then code. `settled`: settled handoffs per group (a group missing counts 0)."""
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    acc: dict[tuple[str | None, str], tuple[int, set[str], set[str]]] = {}
    total: dict[str | None, int] = defaultdict(int)
    for group, raw, n, ids in rows:
        code = raw if raw in _VOCABULARY else ERROR_CODE_OTHER
        cnt, ex, raws = acc.get((group, code), (0, set(), set()))
        acc[(group, code)] = (cnt + int(n), ex | set(ids), raws | {raw})
        total[group] += int(n)
    out = [
        Rejection(
            error_code=code,
            count=cnt,
            share_of_rejections=rate(cnt, total[group]),
            share_of_settled=rate(cnt, settled.get(group, 0)),
            examples=tuple(sorted(ex)[:examples]),
            raw_codes=tuple(sorted(raws)),
            group=group,
        )
        for (group, code), (cnt, ex, raws) in acc.items()
    ]
    return sorted(out, key=lambda r: (r.group or "", -r.count, r.error_code))


def rejections(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    by: str | None = None,
    examples: int = 3,
) -> list[Rejection]:
    """The cohort's rejected handoffs by error code (see the module doc), sliced by one
    dimension of DIMENSIONS when `by` is given (Rejection.group holds its value; with
    `capability` a handoff counts under each of its capabilities). One query, no pandas.
    ValueError for an unknown dimension or examples < 0."""
    db = check_db(database)
    dims = check_dims(() if by is None else (by,))
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    extra = [c for d in dims for c in DIM_COLUMNS[d]]
    t = tenant is not None
    params: dict[str, Any] = {"tenant": tenant} if t else {}
    window = settled_window(client, db, window, tenant)
    cohort = cohort_sql(db, window, tenant_param=t, extra=extra)
    grp = dim_expr(dims[0]) if dims else "''"
    keep = max(1, 2 * int(examples))
    rejected = f"is_settled AND {cs.has('tmask', cs.REJECTED_MASK)}"
    # one read of the cohort: per group its settled handoffs and its rejected ones, which
    # alone (few) are then joined to their reject rows; a group without a rejected handoff
    # keeps one row (LEFT ARRAY JOIN) for its settled count
    sql = f"""SELECT grp, settled, raw, countIf(handoff_id != '') AS n,
    groupArraySortedIf({keep})(handoff_id, handoff_id != '') AS ex
FROM (
    SELECT g.grp AS grp, g.settled AS settled, g.rej.2 AS handoff_id, r.raw AS raw
    FROM (
        SELECT grp, settled, rej FROM (
            SELECT {grp} AS grp, countIf(is_settled) AS settled,
                groupArrayIf((tenant, handoff_id), {rejected}) AS rejs
            FROM ({cohort})
            GROUP BY grp
        ) LEFT ARRAY JOIN rejs AS rej
    ) AS g
    LEFT JOIN (
        -- every reject row (few: a reject is one row per rejected handoff), joined to the
        -- rejected handoffs only
        SELECT tenant, handoff_id, argMin(CAST(error_code, 'String'), (time, span_id)) AS raw
        FROM {db}.handoff_transitions
        PREWHERE event = 'reject'
        WHERE {_REJECT}
        GROUP BY tenant, handoff_id
    ) AS r ON r.tenant = g.rej.1 AND r.handoff_id = g.rej.2
)
GROUP BY grp, settled, raw
SETTINGS join_use_nulls = 0"""
    rows = client.query(sql, parameters=params).result_rows
    key = (lambda g: str(g)) if dims else (lambda _g: None)
    settled = {key(g): int(n_settled) for g, n_settled, _raw, _n, _ex in rows}
    found = ((key(g), raw, n, ex) for g, _s, raw, n, ex in rows if n)
    return group_codes(found, settled, examples=examples)
