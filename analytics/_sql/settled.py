"""The state pass from settled flags (sql/013) plus the live remainder, and the settle job.

The state pass's kinds (analytics._sql.state_passes.state_kinds) are functions of one
handoff's own state rows. So they are computed once the rows came in and kept:

  settle      every `touched` state row (sql/013: its insert time) in [watermark, until)
              names a handoff whose kinds or summary may have changed: its rows are
              merged, its kinds computed and written to handoff_state_flags (a row when a
              kind is set; its row of an earlier settle replaced by 0 first), its merged
              handoff_summary row copied to handoff_settled (sql/014, ordered by created
              time, read by analytics._sql.cohort.cohort_sql; its row of an earlier settle
              marked not alive first), then every tenant's watermarks move to `until`. Rows
              are written before the watermarks, so a reader seeing a new watermark sees
              them. The two tables keep their own watermark (a store settled before sql/014
              has flags and no copy): a settle starts from the lesser.
  state pass  the flags of the cohort (created in the window) whose rows were all touched
              before the watermark, plus the kinds recomputed over the handoffs touched
              since (the live remainder: what came in after the last settle), so a query
              is as fresh as the rows it can read. With no watermark (a store never
              settled, or a tenant reader of a tenant no settle has seen) the whole pass
              is recomputed, as before.

`until` lags the store's clock by SETTLE_LAG_S: a row's `touched` is taken when its insert
block is formed, and the row is readable once the part is committed, a moment later; a
settle reads only rows whose insert ended long enough ago that none can still appear.

Any watermark at or below the true one gives the same result (more handoffs recomputed
live), so the all-tenant pass takes the least of the tenants' watermarks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Final

from analytics._sql.anomaly_state import TABLE
from analytics._sql.cohort import Window, check_db, ts
from analytics._sql.inferred_policy import policy
from analytics._sql.settled_audits import audit_settle_sql
from analytics._sql.settled_relations import relation_settle_sql
from analytics._sql.state_passes import (
    STATE_PASS_COLUMNS,
    merged_columns,
    state_kinds,
    state_kinds_sql,
    state_pass,
)
from analytics._sql.watermarks import (
    AUDIT_FLAGS_TABLE,
    AUDIT_WATERMARK_TABLE,
    COHORT_COLUMNS,
    COHORT_TABLE,
    COHORT_WATERMARK_TABLE,
    EPOCH,
    FLAGS_TABLE,
    RELATION_FLAGS_TABLE,
    RELATION_WATERMARK_TABLE,
    WATERMARK_TABLE,
    live_keys_sql,
    watermark_sql,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "FLAGS_TABLE",
    "SETTLE_LAG_S",
    "STATE_KIND_BITS",
    "KeyRange",
    "SettleResult",
    "cohort_settle_sql",
    "key_ranges",
    "settle",
    "settle_bounds",
    "settled_state_pass",
]

log = logging.getLogger("handoffs.analytics.settle")

#: seconds the settle's upper bound stays behind the store's clock (see module doc)
SETTLE_LAG_S: Final = 30
#: kind -> its bit in handoff_state_flags.flags
STATE_KIND_BITS: Final = {kind: i for i, (kind, _e) in enumerate(state_kinds())}
#: the settle's watermark tables (state flags, cohort copy, relation flags, audit flags): a
#: settle starts from the least and moves them all
_WATERMARKS: Final = (
    WATERMARK_TABLE,
    COHORT_WATERMARK_TABLE,
    RELATION_WATERMARK_TABLE,
    AUDIT_WATERMARK_TABLE,
)
#: handoffs merged per settle query (a first settle of a big store runs in slices by hash)
KEYS_PER_SLICE: Final = 500_000
_EPOCH_MS: Final = 0
#: a mutation of the state table not done yet: a store from before sql/013 while its rows
#: get `touched` (until then they read as just touched; a part rewritten by it becomes
#: readable after its time was taken, so no settle runs meanwhile)
_PENDING_SQL: Final = (
    "SELECT count() FROM system.mutations WHERE database = '{db}'"
    " AND startsWith(table, '{table}') AND NOT is_done"
)


@dataclass(frozen=True, slots=True)
class SettleResult:
    """One settle: the watermark before and after (ms since the epoch; 0 = never settled),
    the handoffs recomputed and how long it took (ms)."""

    since_ms: int
    until_ms: int
    handoffs: int
    elapsed_ms: float


def settle_bounds(watermark_ms: int, now_ms: int, lag_s: float) -> tuple[int, int] | None:
    """[since, until) of the next settle: from the watermark to `lag_s` before the store's
    clock, or None when that is not after the watermark (nothing new can be settled)."""
    if lag_s < 0:
        raise ValueError(f"lag_s must be >= 0, got {lag_s}")
    until = now_ms - int(lag_s * 1000)
    return (watermark_ms, until) if until > watermark_ms else None


def slices_for(handoffs: int, per: int = KEYS_PER_SLICE) -> int:
    """Slices a settle of `handoffs` runs in, `per` handoffs each (bounded memory per query)."""
    return max(1, -(-handoffs // per))


@dataclass(frozen=True, slots=True)
class KeyRange:
    """A slice of a settle: the keys (tenant, handoff_id) in [lo, hi), None = unbounded.
    A range of the tables' primary key, so each slice reads only its own granules."""

    lo: tuple[str, str] | None = None
    hi: tuple[str, str] | None = None

    def sql(self) -> str:
        """The condition on (tenant, handoff_id), with the bounds as query parameters."""
        conds = []
        if self.lo is not None:
            conds.append(
                "(tenant > {lo_t:String} OR (tenant = {lo_t:String} AND handoff_id >= {lo_h:String}))"
            )
        if self.hi is not None:
            conds.append(
                "(tenant < {hi_t:String} OR (tenant = {hi_t:String} AND handoff_id < {hi_h:String}))"
            )
        return " AND ".join(conds) or "1"

    def params(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.lo is not None:
            out |= {"lo_t": self.lo[0], "lo_h": self.lo[1]}
        if self.hi is not None:
            out |= {"hi_t": self.hi[0], "hi_h": self.hi[1]}
        return out


def key_ranges(sample: Sequence[tuple[str, str]], slices: int) -> list[KeyRange]:
    """`slices` ranges of about equal size cut at evenly spaced keys of `sample` (a sample
    of the keys to settle, any order); one unbounded range when there is one slice."""
    keys = sorted(set(sample))
    if slices <= 1 or not keys:
        return [KeyRange()]
    cuts = sorted({keys[len(keys) * j // slices] for j in range(1, slices)} - {keys[0]})
    bounds: list[tuple[str, str] | None] = [None, *cuts, None]
    return [KeyRange(lo, hi) for lo, hi in pairwise(bounds)]


def _ms(expr_ms: int) -> str:
    return f"fromUnixTimestamp64Milli(toInt64({expr_ms}), 'UTC')"


def _touched_keys(db: str, since_ms: int, until_ms: int) -> str:
    """Keys with a state row touched in [since, until) (the skip index on `touched` keeps
    parts and granules written before `since` unread)."""
    lo = "" if since_ms <= _EPOCH_MS else f"touched >= {_ms(since_ms)} AND "
    return (
        f"SELECT DISTINCT tenant, handoff_id FROM {db}.{TABLE} WHERE {lo}touched < {_ms(until_ms)}"
    )


def _merged_state(db: str, where: str, having: str = "1") -> str:
    """One merged state row per handoff with a row matching `where` (all its rows merged):
    tenant, handoff_id, created and STATE_PASS_COLUMNS."""
    return f"""SELECT tenant, handoff_id, min(created) AS created, {merged_columns(STATE_PASS_COLUMNS)}
    FROM {db}.{TABLE}
    WHERE {where}
    GROUP BY tenant, handoff_id
    HAVING {having}"""


def _flags_expr() -> str:
    return " + ".join(f"toUInt8({kind}) * {1 << bit}" for kind, bit in STATE_KIND_BITS.items())


def settle_sql(
    db: str, since_ms: int, until_ms: int, part: KeyRange = KeyRange(), replaces: bool = True
) -> str:
    """INSERT of the flags of the handoffs touched in [since, until) in the key range
    `part` (its bounds are query parameters): a row per flagged one (version 2 x until + 1),
    and unless `replaces` is False (the table holds no row yet) a 0 (version 2 x until) over
    each one's row of an earlier settle, which the new row replaces when its created time is
    the same and which stays 0 when it moved or no kind is set now."""
    keys = f"{_touched_keys(db, since_ms, until_ms)} AND {part.sql()}"
    rows = _merged_state(db, f"{part.sql()} AND (tenant, handoff_id) IN ({keys})")
    kinds = state_kinds_sql(rows, flagged_only=False, carry=", created")
    return f"""INSERT INTO {db}.{FLAGS_TABLE} (tenant, handoff_id, created, flags, version)
SELECT tenant, handoff_id, assumeNotNull(created), {_flags_expr()} AS flags,
    toUInt64({2 * until_ms + 1})
FROM ({kinds})
WHERE created IS NOT NULL AND flags != 0
UNION ALL
SELECT tenant, handoff_id, created, 0, toUInt64({2 * until_ms})
FROM {db}.{FLAGS_TABLE} FINAL
WHERE {"flags != 0" if replaces else "0"} AND (tenant, handoff_id) IN ({keys})"""


def cohort_settle_sql(
    db: str, since_ms: int, until_ms: int, part: KeyRange = KeyRange(), replaces: bool = True
) -> str:
    """INSERT of the merged handoff_summary rows of the handoffs touched in [since, until),
    in the key range `part`, into handoff_settled (as settle_sql): a row per handoff with
    a created time (alive, version 2 x until + 1), and a row not alive (version 2 x until)
    at each created time an earlier settle stored the handoff under, which the new row
    replaces when its created time is the same (the copy's rows before the touched
    handoffs' earliest created time are not read)."""
    keys = f"{_touched_keys(db, since_ms, until_ms)} AND {part.sql()}"
    # a created time only moves earlier (the least create seen), so a handoff's earlier rows
    # are at or after its created time now: the copy is read from the earliest of those on
    earliest = (
        f"SELECT min(created) FROM {db}.handoff_summary WHERE (tenant, handoff_id) IN ({keys})"
    )
    names = ", ".join(COHORT_COLUMNS)
    fresh = ", ".join("assumeNotNull(created)" if c == "created" else c for c in COHORT_COLUMNS)
    return f"""INSERT INTO {db}.{COHORT_TABLE} ({names}, alive, version)
SELECT {fresh}, 1, toUInt64({2 * until_ms + 1})
FROM (
    SELECT * FROM {db}.handoff_summary FINAL
    WHERE {part.sql()} AND (tenant, handoff_id) IN ({keys})
    -- the created filter must see merged rows (a server may default this on)
    SETTINGS optimize_move_to_prewhere_if_final = 0
)
WHERE created IS NOT NULL
UNION ALL
SELECT {names}, 0, toUInt64({2 * until_ms})
FROM {db}.{COHORT_TABLE}
WHERE {"alive" if replaces else "0"} AND created >= ({earliest})
    AND (tenant, handoff_id) IN ({keys})"""


def settled_state_pass(db: str, window: Window, tenant: bool) -> str:
    """The state pass (same rows as analytics._sql.state_passes.state_pass): the settled
    flags of the cohort, and the kinds of the handoffs touched since the watermark
    recomputed; with no watermark, the whole pass recomputed. A window read against the
    settle state (Window.settled, with the flags settled to the copy's watermark) reads
    only what that state needs: the flags alone when nothing is live, the recomputed pass
    alone when nothing is settled."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    bits = ", ".join(f"bitTest(flags, {bit}) AS {kind}" for kind, bit in STATE_KIND_BITS.items())
    in_window = f"created >= {ts(window.start)} AND created < {ts(window.end)}"
    st = window.settled
    if st is not None and st.flags_match:
        if st.watermark_ms <= 0:
            return state_pass(db, window, tenant)
        flags = f"SELECT tenant, handoff_id, {bits} FROM {db}.{FLAGS_TABLE} FINAL\n    WHERE flags != 0 AND {in_window} {tw}"
        if st.live == 0:
            return flags
        live = live_keys_sql(db, st.wm_sql, tw)
        rows = _merged_state(
            db, f"(tenant, handoff_id) IN ({live}) {tw}", f"created IS NOT NULL AND {in_window}"
        )
        return f"""SELECT * FROM (
    {flags}
      AND (tenant, handoff_id) NOT IN ({live})
    UNION ALL
    {state_kinds_sql(rows)}
)"""
    settled = f"wm > {EPOCH}"
    live = live_keys_sql(db, "wm", tw)
    live_rows = _merged_state(
        db,
        f"{settled} AND (tenant, handoff_id) IN (SELECT arrayJoin(live_keys)) {tw}",
        f"created IS NOT NULL AND {in_window}",
    )
    return f"""WITH ({watermark_sql(db, tenant)}) AS wm,
    (SELECT groupArray((tenant, handoff_id)) FROM ({live})) AS live_keys
SELECT * FROM (
    SELECT tenant, handoff_id, {bits} FROM {db}.{FLAGS_TABLE} FINAL
    WHERE {settled} AND flags != 0 AND {in_window} {tw}
      AND (tenant, handoff_id) NOT IN (SELECT arrayJoin(live_keys))
    UNION ALL
    {state_kinds_sql(live_rows)}
    UNION ALL
    {state_pass(db, window, tenant, guard=f"NOT ({settled})")}
)"""


def _count(client: Client, sql: str) -> int:
    return int(client.query(sql).result_rows[0][0])


def settle(
    client: Client,
    *,
    database: str | None = None,
    lag_s: float = SETTLE_LAG_S,
    progress: Callable[[int, int], None] | None = None,
    keys_per_slice: int = KEYS_PER_SLICE,
) -> SettleResult | None:
    """Settle the state flags of every handoff touched since the watermark up to `lag_s`
    before the store's clock; None when there is nothing to settle yet (no handoff touched
    since the watermark: it stays, and an idle store gains no rows), or while the mutation
    that fills `touched` on a store from before sql/013 runs. A big backlog (the first
    settle of a store) runs in slices of `keys_per_slice` handoffs, each a range of the
    primary key; `progress(done, n)` is called after each slice. Safe to run again after a failure (flags are replaced by
    the latest settle's; the watermark only moves once all flags are written)."""
    db = check_db(database)
    if keys_per_slice < 1:
        raise ValueError(f"keys_per_slice must be >= 1, got {keys_per_slice}")
    t0 = time.perf_counter()
    if _count(client, _PENDING_SQL.format(db=db, table=TABLE)):
        log.info("settle: waiting for the %s.%s mutation that fills `touched`", db, TABLE)
        return None
    row = client.query(
        "SELECT toUnixTimestamp64Milli(now64(3)), least("
        + ", ".join(
            f"(SELECT toUnixTimestamp64Milli(max(watermark)) FROM {db}.{t})" for t in _WATERMARKS
        )
        + ")"
    ).result_rows[0]
    bounds = settle_bounds(int(row[1] or 0), int(row[0]), lag_s)
    if bounds is None:
        return None
    since, until = bounds
    handoffs = _count(client, f"SELECT count() FROM ({_touched_keys(db, since, until)})")
    if not handoffs:  # the watermark may stay: no handoff is live that was not before
        return None
    until_text = _ms(until)
    pol = policy()  # recorded with the audit watermark: what its flags hold
    ranges = [KeyRange()]
    n = slices_for(handoffs, keys_per_slice)
    if n > 1:  # cut at a sample of ~200 keys per slice
        every = max(1, handoffs // (200 * n))
        sample = client.query(
            f"SELECT tenant, handoff_id FROM ({_touched_keys(db, since, until)})"
            f" WHERE cityHash64(tenant, handoff_id) % {every} = 0"
        ).result_rows
        ranges = key_ranges([(str(t), str(h)) for t, h in sample], n)
    # a table with no row yet has none to replace (the first settle of a store)
    flags, copy, relations, audits = (
        _count(client, f"SELECT count() > 0 FROM {db}.{t}") > 0
        for t in (FLAGS_TABLE, COHORT_TABLE, RELATION_FLAGS_TABLE, AUDIT_FLAGS_TABLE)
    )
    for i, part in enumerate(ranges):
        client.command(settle_sql(db, since, until, part, flags), parameters=part.params())
        client.command(cohort_settle_sql(db, since, until, part, copy), parameters=part.params())
        keys = f"{_touched_keys(db, since, until)} AND {part.sql()}"
        client.command(relation_settle_sql(db, keys, until, relations), parameters=part.params())
        client.command(
            audit_settle_sql(db, keys, until, audits, pol=pol),
            parameters=part.params(),
        )
        if progress is not None:
            progress(i + 1, len(ranges))
    for table in _WATERMARKS:
        # the audit flags hold what this policy keeps (keyless gaps up to its window,
        # missing_grant only when it requires grants)
        extra = ("", "")
        if table == AUDIT_WATERMARK_TABLE:
            extra = (
                ", keyless_window_s, require_grants",
                f", {pol.keyless_window_s}, {int(pol.require_grants)}",
            )
        client.command(
            f"INSERT INTO {db}.{table} (tenant, watermark{extra[0]})"
            f" SELECT DISTINCT tenant, {until_text}{extra[1]} FROM {db}.{TABLE}"
        )
    elapsed = (time.perf_counter() - t0) * 1000
    log.debug("settled %d handoffs up to %d ms (%.0f ms)", handoffs, until, elapsed)
    return SettleResult(since, until, handoffs, elapsed)
