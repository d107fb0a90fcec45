"""Per-handoff anomaly state kept at insert: sql/009_handoff_anomaly_state.sql, its columns
and the SQL pieces the passes share (analytics/_sql/state_passes.py reads it).

`handoff_anomaly_state` holds one row per (tenant, handoff_id) after merges, like
handoff_summary: every column an idempotent aggregate (min, max, minMap,
groupUniqArrayArray), so a span stored again, or delivered in another insert block, changes
no value.

`python -m analytics._sql.anomaly_state > sql/009_handoff_anomaly_state.sql` regenerates the
DDL; tests/integration/test_anomaly_state.py fails when the file and this module disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from analytics._sql import contract as cs
from collector import semconv

#: events the receiver (the envelope's to_agent) emits: another actor is a wrong consumer
RECEIVER_EVENTS: Final = ("accept", "reject", "start", "prepare", "commit", "fail")
#: events that use the grant: after its expiry they are grant_expired
GRANT_USE_EVENTS: Final = ("start", "prepare", "commit")
#: events that issue a receipt (and its expiry)
RECEIPT_EVENTS: Final = ("commit", "resolve_committed")
#: the handoff's envelope rows: a counted create (as handoff_summary's `created`)
IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"
#: SQL of what makes two stored rows of one handoff and transition one span stored again
#: (oracle.funnel.copy_key): the same span ids and time. A transport resend re-sends the same
#: bytes; an agent re-emitting a transition makes a new span (a new span id) at a new time.
COPY_KEY: Final = "trace_id, span_id, time"
TABLE: Final = "handoff_anomaly_state"
_T9: Final = "DateTime64(9, 'UTC')"


def sql_tuple(items: Iterable[object]) -> str:
    return "(" + ", ".join(f"'{x}'" for x in items) + ")"


def _attr(name: str) -> str:
    """SQL of one span attribute (the name from collector.semconv, a constant: no injection)."""
    return f"attributes['{name}']"


def iso_sql(expr: str) -> str:
    """An ISO-8601 UTC text as DateTime64(9); NULL when empty or not a time."""
    return f"parseDateTime64BestEffortOrNull(nullIf({expr}, ''), 9, 'UTC')"


def transition_key_sql() -> str:
    """SQL over a handoff_transitions row: k = okey << 24 | event << 16 | from << 8 | to
    (1-based indexes, from 0 = create) for a counted row (legal and not flagged invalid),
    0 for any other. Sorting by k is machine order (collector.contract order_key)."""
    states = [str(x) for x in cs.STATE_RANK]
    ev = sorted({e for _f, e, _t in cs.POSITIONS})
    names = "[" + ", ".join(f"'{x}'" for x in states) + "]"
    events = "[" + ", ".join(f"'{x}'" for x in ev) + "]"

    def code(f: str, e: str, t: str) -> int:
        return (
            (ev.index(e) + 1) * 65536
            + (states.index(f) + 1 if f else 0) * 256
            + states.index(t)
            + 1
        )

    legal = [(code(f, e, t), cs.order_key(f, t) << 24 | code(f, e, t)) for f, e, t in cs.POSITIONS]
    codes = "[" + ", ".join(str(c) for c, _k in legal) + "]"
    keys = "[" + ", ".join(str(k) for _c, k in legal) + "]"
    return (
        f"if(valid, transform(toUInt32(indexOf({events}, event) * 65536"
        f" + indexOf({names}, from_state) * 256 + indexOf({names}, to_state)),"
        f" {codes}, {keys}, toUInt64(0)), toUInt64(0))"
    )


#: (column, type, aggregate over a handoff_transitions row set): the table and its view
_COLUMNS: Final = (
    ("created", f"min, Nullable({_T9})", f"min(if({IS_CREATE}, time, NULL))"),
    ("task_id", "max, String", "max(task_id)"),
    ("to_agent", "max, LowCardinality(String)", f"max(if({IS_CREATE}, to_agent, ''))"),
    (
        "capabilities",
        "max, Array(String)",
        f"max(if({IS_CREATE}, CAST(capabilities, 'Array(String)'), CAST([], 'Array(String)')))",
    ),
    (
        "copies",
        "groupUniqArrayArray, Array(UInt64)",
        "groupUniqArrayArray([bitOr(bitShiftLeft(cityHash64(event, from_state, to_state)"
        f" % 4294967296, 32), cityHash64({COPY_KEY}) % 4294967296)])",
    ),
    (
        "first_times",
        "minMap, Tuple(Array(UInt32), Array(Int64))",
        "minMap(if(k > 0, [toUInt32(k)], []), if(k > 0, [toUnixTimestamp64Nano(time)], []))",
    ),
    (
        "receiver_min",
        "min, LowCardinality(Nullable(String))",
        f"min(if(event IN {sql_tuple(RECEIVER_EVENTS)}, actor, NULL))",
    ),
    (
        "receiver_max",
        "max, LowCardinality(Nullable(String))",
        f"max(if(event IN {sql_tuple(RECEIVER_EVENTS)}, actor, NULL))",
    ),
    (
        "t_grant_use",
        f"max, Nullable({_T9})",
        f"max(if(event IN {sql_tuple(GRANT_USE_EVENTS)}, time, NULL))",
    ),
    (
        "grant_expires_at",
        "max, String",
        f"max(if({IS_CREATE}, {_attr(semconv.GRANT_EXPIRES_AT)}, ''))",
    ),
    (
        "grant_capabilities",
        "max, Nullable(String)",
        f"max(if({IS_CREATE} AND mapContains(attributes, '{semconv.GRANT_CAPABILITIES}'),"
        f" {_attr(semconv.GRANT_CAPABILITIES)}, NULL))",
    ),
    ("grant_tenant", "max, String", f"max(if({IS_CREATE}, {_attr(semconv.GRANT_TENANT)}, ''))"),
    (
        "claim_mismatch",
        "max, UInt8",
        "max(toUInt8(claimed_tenant != '' AND claimed_tenant != tenant))",
    ),
    ("retry_of", "max, String", f"max(if({IS_CREATE}, {_attr(semconv.RETRY_OF)}, ''))"),
    ("causation_id", "max, String", f"max(if({IS_CREATE}, {_attr(semconv.CAUSATION_ID)}, ''))"),
    (
        "t_verified",
        f"min, Nullable({_T9})",
        "min(if(valid AND event = 'verify' AND from_state = 'committed'"
        " AND to_state = 'verified', time, NULL))",
    ),
    (
        "receipt_expiry",
        f"min, Nullable({_T9})",
        f"min(if(valid AND event IN {sql_tuple(RECEIPT_EVENTS)},"
        f" {iso_sql(_attr(semconv.RECEIPT_EXPIRES_AT))}, NULL))",
    ),
    (
        "idempotency_keys",
        "groupUniqArrayArray, Array(String)",
        "groupUniqArrayArray(if(event = 'create' AND idempotency_key != '',"
        " [idempotency_key], []))",
    ),
    (
        "idempotency_payloads",
        "groupUniqArrayArray, Array(Tuple(String, String))",
        "groupUniqArrayArray(if(event = 'create' AND idempotency_key != ''"
        " AND payload_hash != '', [(idempotency_key, payload_hash)], []))",
    ),
    (
        "fences",
        "groupUniqArrayArray, "
        f"Array(Tuple({_T9}, String, String, String, Nullable(Int64), Nullable(Int64)))",
        "groupUniqArrayArray(if(fence_token IS NOT NULL OR state_version IS NOT NULL,"
        " [(time, span_id, row_task_id, CAST(event, 'String'), fence_token, state_version)], []))",
    ),
)
#: column -> the aggregate function that merges its values across rows (its type's)
MERGE_FN: Final = {name: t.split(",", 1)[0] for name, t, _e in _COLUMNS}
_HEADER: Final = """\
-- GENERATED by `python -m analytics._sql.anomaly_state`; do not edit.
-- tests/integration/test_anomaly_state.py fails when this file and the module disagree.
--
-- handoff_anomaly_state: one row per (tenant, handoff_id) after merges, what the anomaly
-- kinds need besides handoff_summary, so no anomaly query reads handoff_transitions (at
-- 10M transitions the envelope and transitions passes read every transition of the window,
-- the attribute map included). AggregatingMergeTree, ORDER BY (tenant, handoff_id), no
-- PARTITION BY, read `FINAL` with the created filter after the merge: as handoff_summary.
-- Every column is idempotent (min, max, minMap, maxMap, groupUniqArrayArray): a span
-- stored again or a duplicate delivery in another insert block changes no value.
--   copies                the distinct (transition, copy) pairs of the rows, each packed in
--                         one UInt64: the low 32 bits of cityHash64(event, from, to) << 32 |
--                         the low 32 bits of cityHash64(trace_id, span_id, time); a transition
--                         in two pairs was stored as two spans (duplicate_delivery)
--   first_times           per counted transition k (machine order << 24 | event, from, to
--                         indexes) its earliest time in ns: the clock-skew check
--   receiver_min / _max   least and greatest actor of the receiver events (wrong_consumer)
--   fences                (time, span_id, task_id, event, fence_token, state_version) of the
--                         rows that carry a fence token or state version (stale_fence)
-- The other columns are the envelope's grant, retry_of and causation_id (from the counted
-- create rows), tenant claims, the first verify and the earliest receipt expiry, and the
-- create rows' idempotency keys and (key, payload hash) pairs.
-- A store created before this file is backfilled once by the INSERT below (after the view
-- exists: a row inserted meanwhile lands twice, which changes no value).
"""


def _select(db: str) -> str:
    cols = "".join(f"    {expr} AS {name},\n" for name, _t, expr in _COLUMNS).rstrip(",\n")
    return f"""SELECT
    tenant,
    handoff_id,
{cols}
FROM (SELECT *, task_id AS row_task_id, {transition_key_sql()} AS k
      FROM {db}.handoff_transitions)
GROUP BY tenant, handoff_id"""


def render_state_ddl() -> str:
    """The text of sql/009_handoff_anomaly_state.sql."""
    cols = ",\n".join(f"    `{name}` SimpleAggregateFunction({t})" for name, t, _e in _COLUMNS)
    names = ", ".join(["tenant", "handoff_id", *(name for name, _t, _e in _COLUMNS)])
    return f"""{_HEADER}CREATE TABLE IF NOT EXISTS {{db}}.{TABLE}
(
    `tenant` LowCardinality(String),
    `handoff_id` String,
{cols}
)
ENGINE = AggregatingMergeTree
ORDER BY (tenant, handoff_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.{TABLE}_mv TO {{db}}.{TABLE} AS
{_select("{db}")};

INSERT INTO {{db}}.{TABLE} ({names})
{_select("{db}")}
SETTINGS optimize_aggregation_in_order = 1;
"""


if __name__ == "__main__":  # pragma: no cover - regeneration helper
    print(render_state_ddl(), end="")
