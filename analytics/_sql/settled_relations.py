"""The relation kinds (bounce, blind retry, duplicate execution, idempotency conflict) from
settled flags (sql/015) plus the live remainder, and their part of the settle job
(analytics._sql.settled).

Unlike the state kinds, these are functions of a handoff and the handoffs it relates to: its
task's other transfers (bounce: the previous transfer of the task), the attempts sharing
its idempotency key (and their payload hashes: idempotency conflict), the one its
`retry_of` names and, for a blind retry the sender did not link, its task's attempts to the
same agent (blind retry, duplicate execution).
None depends on the window, so they are kept per handoff as the state kinds are:

  settle      the handoffs touched in [watermark, until) and every handoff related to one
              of them (related_keys_sql: whose flags a touched handoff's rows may change)
              get their kinds recomputed (the passes' SQL with those handoffs as subjects)
              and written to handoff_relation_flags, as the state flags are (a row when a
              kind is set; the row of an earlier settle replaced by a 0 first).
  pass        the flags of the cohort but the handoffs related to a live one, plus those
              recomputed: a handoff whose relations changed since the settle is read as it
              is now. With nothing live, the flags alone; with no watermark matching the
              cohort copy's, the whole pass recomputed, as before.
"""

from __future__ import annotations

from typing import Final

from analytics._sql.anomaly_state import TABLE as STATE_TABLE
from analytics._sql.cohort import Window, ts
from analytics._sql.state_passes import Subject, bounce_sql, idempotency_sql, retry_sql
from analytics._sql.watermarks import RELATION_FLAGS_TABLE, live_keys_sql

__all__ = [
    "RELATION_KIND_BITS",
    "RELATION_PASSES",
    "related_keys_sql",
    "relation_flags_sql",
    "relation_settle_sql",
    "settled_relation_pass",
]

#: kind -> its bit in handoff_relation_flags.flags
RELATION_KIND_BITS: Final = {
    "bounce": 0,
    "blind_retry": 1,
    "duplicate_execution": 2,
    "idempotency_conflict": 3,
}
#: pass -> its kinds and the SQL builder over a subject (analytics._sql.state_passes)
RELATION_PASSES: Final = {
    "bounce": (("bounce",), bounce_sql),
    "retry": (("blind_retry", "duplicate_execution"), retry_sql),
    "idempotency": (("idempotency_conflict",), idempotency_sql),
}
#: the passes whose bit came with sql/018: read settled only from a settle that also wrote
#: the audit flags (Settled.audits_match), so a store settled before re-settles them first
_SINCE_AUDITS: Final = frozenset({"idempotency"})


def related_keys_sql(db: str, keys: str) -> str:
    """(tenant, handoff_id) of the handoffs of `keys` (SQL of such rows) and of every handoff
    whose relation kinds their rows can change: the handoffs of their transfers' tasks (by
    primary key through handoff_tasks, sql/005), the handoffs sharing one of their
    idempotency keys (the summary's, and every key the state holds from a create row: an
    idempotency conflict reads those), the handoffs whose `retry_of` names one of them, and
    the handoffs of the tasks of those that entered unknown (a retry inferred from the task,
    agents and objective, analytics._sql.inferred_retry) (each relation as the passes read
    it: handoff_summary's rows, the state's keys and `retry_of`)."""
    return f"""SELECT tenant, handoff_id FROM ({keys})
UNION ALL
SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
    SELECT tenant, task_id FROM {db}.handoff_summary
    WHERE mode = 'transfer' AND created IS NOT NULL AND task_id != ''
      AND (tenant, handoff_id) IN ({keys}))
UNION ALL
SELECT tenant, handoff_id FROM {db}.handoff_summary
WHERE idempotency_key != '' AND (tenant, idempotency_key) IN (
    SELECT tenant, idempotency_key FROM {db}.handoff_summary
    WHERE idempotency_key != '' AND (tenant, handoff_id) IN ({keys}))
UNION ALL
SELECT tenant, handoff_id FROM (
    SELECT tenant, handoff_id, arrayJoin(idempotency_keys) AS key FROM {db}.{STATE_TABLE}
    WHERE notEmpty(idempotency_keys))
WHERE (tenant, key) IN (
    SELECT tenant, arrayJoin(idempotency_keys) FROM {db}.{STATE_TABLE}
    WHERE (tenant, handoff_id) IN ({keys}))
UNION ALL
SELECT tenant, handoff_id FROM {db}.{STATE_TABLE}
WHERE retry_of != '' AND (tenant, retry_of) IN ({keys})
UNION ALL
SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
    SELECT tenant, task_id FROM {db}.handoff_summary
    WHERE t_unknown_in IS NOT NULL AND task_id != '' AND (tenant, handoff_id) IN ({keys}))"""


def _of(keys: str) -> Subject:
    return lambda c: f"{c} IS NOT NULL AND (tenant, handoff_id) IN ({keys})"


def relation_flags_sql(db: str, keys: str) -> str:
    """tenant, handoff_id, created and the relation flags (RELATION_KIND_BITS) of the
    flagged handoffs of `keys` (SQL of (tenant, handoff_id) rows), from the passes' SQL with
    them as subjects and as the scope the passes read by primary key: one row per handoff,
    its bits OR-ed over the passes' rows."""
    parts = []
    for kinds, build in RELATION_PASSES.values():
        bits = " + ".join(f"toUInt8({k}) * {1 << RELATION_KIND_BITS[k]}" for k in kinds)
        parts.append(
            f"SELECT tenant, handoff_id, assumeNotNull(created) AS created, {bits} AS bits"
            f" FROM ({build(db, False, _of(keys), keys)})"
        )
    union = "\n    UNION ALL\n    ".join(parts)
    return f"""SELECT tenant, handoff_id, min(created) AS created, groupBitOr(bits) AS flags FROM (
    {union}
) GROUP BY tenant, handoff_id HAVING flags != 0"""


def _related_once(db: str, keys: str) -> tuple[str, str]:
    """A WITH clause computing the related set of `keys` (related_keys_sql) once per query
    as a constant array, and SQL of its (tenant, handoff_id) rows: the passes read the set
    several times (subjects, scope, replaced rows), and a subquery inlined in each place is
    evaluated in each."""
    with_ = f"WITH (SELECT groupArray((tenant, handoff_id)) FROM ({related_keys_sql(db, keys)})) AS related"
    rows = "SELECT k.1 AS tenant, k.2 AS handoff_id FROM (SELECT arrayJoin(related) AS k)"
    return with_, rows


def relation_settle_sql(db: str, keys: str, until_ms: int, replaces: bool = True) -> str:
    """INSERT of the relation flags of the handoffs related to `keys` (SQL of the touched
    handoffs' (tenant, handoff_id); its query parameters bound by the caller): a row per
    flagged one (version 2 x until + 1), and unless `replaces` is False (the table holds no
    row yet) a 0 (version 2 x until) over each one's row of an earlier settle, which the
    new row replaces when its created time is the same (as analytics._sql.settled.settle_sql)."""
    with_, related = _related_once(db, keys)
    return f"""INSERT INTO {db}.{RELATION_FLAGS_TABLE} (tenant, handoff_id, created, flags, version)
{with_}
SELECT tenant, handoff_id, created, flags, toUInt64({2 * until_ms + 1})
FROM ({relation_flags_sql(db, related)})
UNION ALL
SELECT tenant, handoff_id, created, 0, toUInt64({2 * until_ms})
FROM {db}.{RELATION_FLAGS_TABLE} FINAL
WHERE {"flags != 0" if replaces else "0"} AND (tenant, handoff_id) IN ({related})"""


def settled_relation_pass(name: str, db: str, window: Window, tenant: bool) -> str:
    """The relation pass `name` (same rows as its recomputation, analytics._sql.state_passes):
    the settled flags of the cohort and the handoffs related to a live one recomputed, when
    the window was read against the settle state (Window.settled) and the relation flags
    were settled to the copy's watermark; else the whole pass recomputed."""
    kinds, build = RELATION_PASSES[name]
    tw = "AND tenant = {tenant:String}" if tenant else ""
    st = window.settled

    def in_window(c: str) -> str:
        return f"{c} IS NOT NULL AND {c} >= {ts(window.start)} AND {c} < {ts(window.end)} {tw}"

    cols = ", ".join(kinds)
    if (
        st is None
        or not st.relations_match
        or st.watermark_ms <= 0
        or (name in _SINCE_AUDITS and not st.audits_match)
    ):
        return f"SELECT tenant, handoff_id, {cols} FROM ({build(db, tenant, in_window)})"
    mask = sum(1 << RELATION_KIND_BITS[k] for k in kinds)
    bits = ", ".join(f"bitTest(flags, {RELATION_KIND_BITS[k]}) AS {k}" for k in kinds)
    flags = f"""SELECT tenant, handoff_id, {bits} FROM {db}.{RELATION_FLAGS_TABLE} FINAL
    WHERE bitAnd(flags, {mask}) != 0 AND {in_window("created")}"""
    if st.live == 0:
        return flags
    with_, related = _related_once(db, live_keys_sql(db, st.wm_sql, tw))
    live = build(
        db, tenant, lambda c: f"{in_window(c)} AND (tenant, handoff_id) IN ({related})", related
    )
    return f"""{with_}
SELECT * FROM (
    {flags}
      AND (tenant, handoff_id) NOT IN ({related})
    UNION ALL
    SELECT tenant, handoff_id, {cols} FROM ({live})
)"""
