"""The anomaly passes that read handoff_anomaly_state (sql/009, analytics._sql.anomaly_state)
instead of the transitions, one row per handoff:
  state        the dense kinds, one read of the cohort's rows: duplicate delivery (a
               transition in two distinct copy pairs), clock skew (per counted transition
               its earliest time, in machine order) and the envelope's (the receiver
               actors' least and greatest, the latest grant use, the grant from the create
               rows, tenant claims)
  fence        the rows carrying a fence token or state version (a few per handoff), of the
               tasks of the cohort's fenced commits
  idempotency  the create rows' (key, payload hash) pairs
  retry        the created-row `retry_of` (the attempts still come from handoff_summary;
               retries linked by inference: analytics._sql.inferred_retry)
  causation    the created-row `causation_id`; the consumed handoff's first verify and
               receipt expiry
  bounce       handoff_summary's transfer rows of tasks with two transfers or more
Sparse kinds (retry, causation, idempotency, fence) select candidates by a cheap column
first and merge only their rows; the dense ones merge only the keys with several rows
(state_cohort).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from analytics._sql.anomaly_state import MERGE_FN, RECEIPT_EVENTS, TABLE, iso_sql, sql_tuple
from analytics._sql.cohort import Window, ts
from analytics._sql.inferred_retry import inferred_retries_sql

#: which handoffs a pass flags, as SQL over a handoff's `tenant`, `handoff_id` and the
#: created-time column it is given (the cohort: created in the window)
Subject = Callable[[str], str]


def _tenant_and(tenant: bool) -> str:
    return "AND tenant = {tenant:String}" if tenant else ""


def _in_window(window: Window, col: str = "created") -> str:
    return f"{col} IS NOT NULL AND {col} >= {ts(window.start)} AND {col} < {ts(window.end)}"


def state_cohort(
    db: str, window: Window, tenant: bool, cols: tuple[str, ...], guard: str = "1"
) -> str:
    """The cohort's state rows (created in the window), one per handoff, with `cols`;
    nothing is read unless the constant SQL condition `guard` holds.

    Not read `FINAL`: merging every row through the aggregate functions costs ~3x the read
    (minMap over first_times above all, even for a key with one row), and after merges, or
    when a handoff's spans came in one request, nearly every key has one row. So a key
    with one row is read as it is (its row is the whole handoff), and only the keys with
    several rows (by hash: a collision merges a single row too, which changes nothing) are
    merged by GROUP BY. Their hashes are a scalar, computed once for both reads; when there
    are none (a merged store) the second read reads nothing. The reads may see different
    parts: a row inserted between them for a single-row key is left out when it holds no
    create (only create rows carry `created`), so that handoff is what the first read saw."""
    tw = _tenant_and(tenant)
    key = "cityHash64(tenant, handoff_id)"
    multi = f"SELECT {key} AS h FROM {db}.{TABLE} WHERE {guard} {tw} GROUP BY h HAVING count() > 1"
    plain = ", ".join(cols)
    return f"""WITH (SELECT groupArray(h) FROM ({multi})) AS multi
    SELECT tenant, handoff_id, {plain} FROM {db}.{TABLE}
    WHERE {guard} AND {_in_window(window)} {tw} AND {key} NOT IN (SELECT arrayJoin(multi))
    UNION ALL
    SELECT tenant, handoff_id, {merged_columns(cols)} FROM {db}.{TABLE}
    WHERE {guard} AND notEmpty(multi) AND {key} IN (SELECT arrayJoin(multi)) {tw}
    GROUP BY tenant, handoff_id
    HAVING {_in_window(window, "min(created)")}"""


def merged_columns(cols: tuple[str, ...]) -> str:
    """SQL of `cols` merged over a handoff's state rows (in a GROUP BY tenant, handoff_id)."""
    return ", ".join(f"{MERGE_FN[c]}({c}) AS {c}" for c in cols)


def _candidates(db: str, window: Window, tenant: bool, where: str, aggs: str) -> str:
    """Handoffs of the cohort with a state row matching `where` (a cheap filter before any
    merge): their rows merged by GROUP BY, `aggs` over them."""
    return f"""SELECT tenant, handoff_id, min(created) AS created, {aggs}
    FROM {db}.{TABLE}
    WHERE (tenant, handoff_id) IN (
        SELECT tenant, handoff_id FROM {db}.{TABLE} WHERE {where} {_tenant_and(tenant)})
    GROUP BY tenant, handoff_id
    HAVING {_in_window(window)}"""


def _skew_sql() -> str:
    """Clock skew over `c` (first_times as (k, time) pairs): counted transitions x -> y
    (x.to = y.from, y not the way back, x before y in machine order) with y's earliest time
    before x's; first_times is sorted by k (machine order), so when its times never
    decrease nothing can be skewed and the quadratic check runs only on the others."""

    def to_(v: str) -> str:
        return f"bitAnd({v}, 255)"

    def from_(v: str) -> str:
        return f"bitAnd(bitShiftRight({v}, 8), 255)"

    def okey(v: str) -> str:
        return f"bitShiftRight({v}, 24)"

    follows = (
        f"{to_('x.1')} = {from_('y.1')} AND {to_('y.1')} != {from_('x.1')}"
        f" AND {okey('x.1')} < {okey('y.1')} AND y.2 < x.2"
    )
    return (
        "NOT arrayAll(d -> d >= 0, arrayDifference(first_times.2))"
        f" AND arrayExists(x -> arrayExists(y -> {follows}, c), c)"
    )


#: the state columns the state pass reads, one row per cohort handoff
STATE_PASS_COLUMNS: Final = (
    "copies",
    "first_times",
    "to_agent",
    "capabilities",
    "receiver_min",
    "receiver_max",
    "t_grant_use",
    "grant_expires_at",
    "grant_capabilities",
    "grant_tenant",
    "claim_mismatch",
)


def state_kinds() -> tuple[tuple[str, str], ...]:
    """(kind, SQL Bool) of the state pass's kinds, over one merged state row per handoff
    with STATE_PASS_COLUMNS, `tenant` and `c` (first_times as (k, time) pairs):

    duplicate_delivery: a transition (event, from, to) stored as more than one copy
    (COPY_KEY): more distinct (transition, copy) pairs than transitions (32-bit hashes each:
    a missed or false pair once in ~4e9). A span stored again unchanged is one copy.
    clock_skew: see _skew_sql.
    The envelope (the greatest value over its counted create rows) against the handoff's
    other rows: wrong_consumer, grant_expired, capability_outside_grant (the grant's
    capabilities are JSON text, an OTLP string[]), grant_tenant_mismatch,
    tenant_claim_mismatch. Each is a function of the handoff's own rows only."""
    g_exp = iso_sql("grant_expires_at")
    return (
        (
            "duplicate_delivery",
            "length(arrayDistinct(arrayMap(x -> bitShiftRight(x, 32), copies))) < length(copies)",
        ),
        ("clock_skew", _skew_sql()),
        (
            "wrong_consumer",
            "to_agent != '' AND coalesce(receiver_min != to_agent OR receiver_max != to_agent,"
            " false)",
        ),
        ("grant_expired", f"coalesce(t_grant_use > {g_exp}, false)"),
        (
            "capability_outside_grant",
            "grant_capabilities IS NOT NULL AND NOT hasAll(JSONExtract("
            "assumeNotNull(grant_capabilities), 'Array(String)'), capabilities)",
        ),
        ("grant_tenant_mismatch", "grant_tenant != '' AND grant_tenant != tenant"),
        ("tenant_claim_mismatch", "claim_mismatch = 1"),
    )


def state_kinds_sql(rows: str, *, flagged_only: bool = True, carry: str = "") -> str:
    """tenant, handoff_id, `carry` (extra columns of `rows`, e.g. ", created") and one Bool
    per state kind over `rows` (one merged state row per handoff); only the flagged ones
    when `flagged_only`."""
    kinds = state_kinds()
    cols = ",\n    ".join(f"{expr} AS {kind}" for kind, expr in kinds)
    where = " OR ".join(kind for kind, _e in kinds) if flagged_only else "1"
    return f"""SELECT tenant, handoff_id{carry},
    {cols}
FROM (SELECT *, arrayZip(first_times.1, first_times.2) AS c FROM ({rows}))
WHERE {where}"""


def state_pass(db: str, window: Window, tenant: bool, guard: str = "1") -> str:
    """The dense kinds (state_kinds) over every cohort handoff's state row (one read,
    state_cohort), recomputed by this query; nothing read unless `guard` holds."""
    return state_kinds_sql(state_cohort(db, window, tenant, STATE_PASS_COLUMNS, guard))


def fence_pass(db: str, window: Window, tenant: bool) -> str:
    """A commit (or resolve_committed) of a cohort handoff whose fence token or state
    version is below the greatest seen earlier in its task (by time, then span id), over the
    stored fenced rows of the tasks of the cohort's fenced commits (rows without either
    value can be neither stale nor raise a maximum)."""
    cand = _candidates(db, window, tenant, "notEmpty(fences)", "groupUniqArrayArray(fences) AS fs")
    commits = f"arrayFilter(r -> r.4 IN {sql_tuple(RECEIPT_EVENTS)}, fs)"
    return f"""WITH c AS (SELECT tenant, handoff_id, arrayJoin({commits}).3 AS task FROM ({cand}))
SELECT DISTINCT tenant, handoff_id, true AS stale_fence FROM (
    SELECT tenant, handoff_id, event, fence_token, state_version,
        max(fence_token) OVER w AS prev_fence, max(state_version) OVER w AS prev_version
    FROM (
        SELECT tenant, handoff_id, r.1 AS time, r.2 AS span_id, r.3 AS task, r.4 AS event,
            r.5 AS fence_token, r.6 AS state_version
        FROM (SELECT tenant, handoff_id, arrayJoin(fences) AS r
              FROM {db}.{TABLE} WHERE notEmpty(fences) {_tenant_and(tenant)})
        WHERE (tenant, task) IN (SELECT tenant, task FROM c)
    )
    WINDOW w AS (PARTITION BY tenant, task ORDER BY time, span_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
WHERE event IN {sql_tuple(RECEIPT_EVENTS)}
  AND (tenant, handoff_id) IN (SELECT tenant, handoff_id FROM c)
  AND (coalesce(fence_token < prev_fence, false) OR coalesce(state_version < prev_version, false))"""


def idempotency_pass(db: str, window: Window, tenant: bool) -> str:
    """Cohort handoffs with a create row whose idempotency key was created elsewhere (any
    handoff of the tenant, any time) with another payload hash (idempotency_sql)."""
    sql = idempotency_sql(db, tenant, lambda c: _in_window(window, c))
    return f"SELECT tenant, handoff_id, idempotency_conflict FROM ({sql})"


def idempotency_sql(db: str, tenant: bool, subject: Subject, scope: str | None = None) -> str:
    """tenant, handoff_id, created, idempotency_conflict of the handoffs `subject` selects
    (SQL over their created column) holding a key whose create rows carry two payload
    hashes or more. With `scope` (SQL of (tenant, handoff_id) rows holding every subject:
    the settle's few handoffs), only the keys the scope's handoffs hold are grouped."""
    tw = _tenant_and(tenant)
    keys_of = ""
    if scope is not None:
        keys_of = f"""AND (tenant, p.1) IN (
            SELECT tenant, arrayJoin(idempotency_keys) FROM {db}.{TABLE}
            WHERE (tenant, handoff_id) IN ({scope}))"""
    conflicts = f"""SELECT tenant, p.1 FROM (
        SELECT tenant, arrayJoin(idempotency_payloads) AS p
        FROM {db}.{TABLE} WHERE notEmpty(idempotency_payloads) {tw})
    WHERE 1 {keys_of}
    GROUP BY tenant, p.1 HAVING uniqExact(p.2) > 1"""
    holders = f"""SELECT tenant, handoff_id FROM (
        SELECT tenant, handoff_id, arrayJoin(idempotency_keys) AS key
        FROM {db}.{TABLE} WHERE notEmpty(idempotency_keys) {tw})
    WHERE (tenant, key) IN ({conflicts})"""
    return f"""SELECT tenant, handoff_id, created, true AS idempotency_conflict FROM (
    SELECT tenant, handoff_id, min(created) AS created FROM {db}.{TABLE}
    WHERE (tenant, handoff_id) IN ({holders})
    GROUP BY tenant, handoff_id
)
WHERE {subject("created")}"""


def _attempts_sql(db: str, keys: str) -> str:
    """One row per handoff from handoff_summary (merged by GROUP BY): what the retry checks
    need. `keys` (SQL of (tenant, handoff_id) rows) selects the handoffs, read by primary
    key; all their rows are merged, so a commit or unknown stored in another insert block
    than the create counts."""
    return f"""SELECT tenant, handoff_id, max(task_id) AS task, max(to_agent) AS target,
        max(idempotency_key) AS idem, min(created) AS created,
        min(t_unknown_in) AS t_in, min(t_unknown_out) AS t_out, min(t_committed) AS t_commit
    FROM {db}.handoff_summary
    WHERE (tenant, handoff_id) IN ({keys})
    GROUP BY tenant, handoff_id"""


def _once(name: str, sql: str, cols: str) -> str:
    """WITH entries computing `sql` (rows of `cols`) once, as a constant array of tuples,
    and a CTE `name` of its rows: a CTE is inlined (read again) at each use, a scalar
    subquery is computed once per query. For a few thousand rows, not a window's."""
    names = [c.strip() for c in cols.split(",")]
    fields = ", ".join(f"x.{i} AS {c}" for i, c in enumerate(names, 1))
    return f"""(SELECT groupArray(tuple({cols})) FROM ({sql})) AS {name}_rows,
    {name} AS (SELECT {fields} FROM (SELECT arrayJoin({name}_rows) AS x))"""


def retry_pass(db: str, window: Window, tenant: bool) -> str:
    """The retry kinds of the cohort (retry_sql)."""
    return retry_sql(db, tenant, lambda c: _in_window(window, c))


def retry_sql(db: str, tenant: bool, subject: Subject, scope: str | None = None) -> str:
    """B (the handoffs `subject` selects) against its earlier attempts A (any handoff of the same tenant: B's
    `retry_of`, or the same task, to_agent and idempotency key, or inferred: no retry_of
    and the same task, agents and objective hash, analytics._sql.inferred_retry; for
    duplicate execution any handoff with B's key). Attempts come from handoff_summary: created, first entry
    into and first exit out of unknown, first entry into committed (counted rows). Only
    handoffs sharing a non-empty key with another handoff, or named by a `retry_of`, can
    pair, so only their summary rows are merged (a same-slot peer shares the key), for B as
    for A; `retry_of` from the state. With `scope` (SQL of (tenant, handoff_id) rows holding
    every subject: the settle's few handoffs), B's rows and `retry_of` are read by primary
    key for those handoffs alone instead of for every handoff that could pair (the same
    rows for the subjects: one whose key no other handoff holds pairs with none)."""
    # the handoffs holding one of b's keys (only a create's row carries it), and the
    # retries' targets
    peers = _attempts_sql(
        db,
        f"""SELECT tenant, handoff_id FROM {db}.handoff_summary
        WHERE idempotency_key != '' AND (tenant, idempotency_key) IN (
            SELECT tenant, idem FROM b WHERE idem != '')
        UNION ALL SELECT tenant, target FROM retries""",
    )
    in_scope = "" if scope is None else f"AND (tenant, handoff_id) IN ({scope})"
    retries = f"""SELECT tenant, handoff_id, max(retry_of) AS target FROM {db}.{TABLE}
    WHERE retry_of != '' {_tenant_and(tenant)} {in_scope} GROUP BY tenant, handoff_id"""
    blind = "a.t_in IS NOT NULL AND a.t_in < b.created AND (a.t_out IS NULL OR a.t_out > b.created)"
    dup = (
        "b.t_commit IS NOT NULL AND a.t_commit IS NOT NULL"
        " AND (assumeNotNull(a.t_commit), a.handoff_id) < (assumeNotNull(b.t_commit), b.handoff_id)"
    )
    # only a cohort handoff with a key another handoff holds too, or with a retry_of, can
    # pair: merge only their summary rows (a store where every handoff has its own key pairs
    # none, and joining every keyed handoff with itself took ~19 s at 2.7M handoffs)
    # (tenant, key) hashes on more than one summary row: a superset of the shared keys (a
    # handoff's create stored twice, a hash collision), made exact by the joins below; a
    # scalar, so it is computed once (the CTEs using it are inlined into both branches), and
    # when it is empty no summary row is read for b (`notEmpty` folds to false)
    shared = f"""SELECT cityHash64(tenant, idempotency_key) AS h FROM {db}.handoff_summary
        WHERE idempotency_key != '' {_tenant_and(tenant)}
        GROUP BY h HAVING count() > 1"""
    pairing = f"""SELECT tenant, handoff_id FROM {db}.handoff_summary
        WHERE notEmpty(shared_keys) AND idempotency_key != '' {_tenant_and(tenant)}
          AND cityHash64(tenant, idempotency_key) IN (SELECT arrayJoin(shared_keys))
        UNION ALL SELECT tenant, handoff_id FROM retries"""
    b = f"""SELECT tenant, handoff_id, max(task_id) AS task_id, max(to_agent) AS to_agent,
        max(idempotency_key) AS idem, min(created) AS created, min(t_committed) AS t_commit
    FROM {db}.handoff_summary
    WHERE (tenant, handoff_id) IN ({pairing if scope is None else scope})
    GROUP BY tenant, handoff_id
    HAVING {subject("created")}"""
    if scope is None:
        ctes = f"""(SELECT groupArray(h) FROM ({shared})) AS shared_keys,
    retries AS ({retries}),
    b AS ({b}),
    peers AS ({peers})"""
    else:  # few rows, each read once into a constant (an inlined CTE is read where used)
        ctes = ",\n    ".join(
            _once(name, sql, cols)
            for name, sql, cols in (
                ("retries", retries, "tenant, handoff_id, target"),
                ("b", b, "tenant, handoff_id, task_id, to_agent, idem, created, t_commit"),
                (
                    "peers",
                    peers,
                    "tenant, handoff_id, task, target, idem, created, t_in, t_out, t_commit",
                ),
            )
        )
    return f"""WITH {ctes}
SELECT b.tenant AS tenant, b.handoff_id AS handoff_id, b.created AS created,
    {blind} AS blind_retry, false AS duplicate_execution
FROM retries AS r
JOIN b ON b.tenant = r.tenant AND b.handoff_id = r.handoff_id
JOIN peers AS a ON a.tenant = r.tenant AND a.handoff_id = r.target
WHERE a.handoff_id != b.handoff_id AND {blind}
UNION ALL
SELECT b.tenant AS tenant, b.handoff_id AS handoff_id, b.created AS created,
    b.task_id = a.task AND b.to_agent = a.target AND {blind} AS blind_retry,
    {dup} AS duplicate_execution
FROM (SELECT * FROM b WHERE idem != '') AS b
JOIN (SELECT * FROM peers WHERE idem != '') AS a ON a.tenant = b.tenant AND a.idem = b.idem
WHERE a.handoff_id != b.handoff_id
  AND ((b.task_id = a.task AND b.to_agent = a.target AND {blind}) OR {dup})
UNION ALL
SELECT tenant, handoff_id, created, true AS blind_retry, false AS duplicate_execution
FROM ({inferred_retries_sql(db, tenant, subject, scope)})"""


def causation_pass(db: str, window: Window, tenant: bool) -> str:
    """C (the cohort, with a causation_id naming a stored handoff A of its tenant) against
    A: C created before A's first counted verify (or A never verified), or after A's
    receipt expiry (the earliest `receipt.expires_at` on A's commit rows)."""
    consumers = _candidates(db, window, tenant, "causation_id != ''", "max(causation_id) AS cause")
    return f"""WITH c AS ({consumers})
SELECT c.tenant AS tenant, c.handoff_id AS handoff_id,
    a.t_verified IS NULL OR c.created < a.t_verified AS consumed_before_verified,
    a.r_exp IS NOT NULL AND c.created > a.r_exp AS expired_receipt_used
FROM c JOIN (
    SELECT tenant, handoff_id, min(t_verified) AS t_verified, min(receipt_expiry) AS r_exp
    FROM {db}.{TABLE}
    WHERE (tenant, handoff_id) IN (SELECT tenant, cause FROM c)
    GROUP BY tenant, handoff_id
) AS a ON a.tenant = c.tenant AND a.handoff_id = c.cause
WHERE c.cause != c.handoff_id"""


def bounce_pass(db: str, window: Window, tenant: bool) -> str:
    """The bounces of the cohort (bounce_sql)."""
    return bounce_sql(db, tenant, lambda c: _in_window(window, c))


def bounce_sql(db: str, tenant: bool, subject: Subject, scope: str | None = None) -> str:
    """A transfer handed straight back: the task's previous transfer (by created time, then
    handoff id) went from this one's to_agent to its from_agent. Only a handoff's create row
    carries its mode (and created time), so handoff_summary's rows with mode 'transfer' are
    exactly the transfer handoffs' create rows: read only those (no cohort FINAL), of the
    tasks with two such rows or more (by task hash: a superset of the tasks with two
    transfers), one of them a subject; a transfer without a task is in none (as the evidence
    package's task rows, sql/005). With `scope` (SQL of (tenant, handoff_id) rows holding
    every subject: the settle's few handoffs), only the handoffs of the scope's tasks are
    read, by primary key through handoff_tasks (sql/005), instead of every transfer."""
    tw = _tenant_and(tenant)
    tasks = f"""(tenant, cityHash64(task_id)) IN (
              SELECT tenant, cityHash64(task_id) AS t FROM {db}.handoff_summary
              WHERE mode = 'transfer' AND created IS NOT NULL AND task_id != '' {tw}
              GROUP BY tenant, t
              HAVING count() > 1 AND countIf({subject("created")}) > 0)"""
    if scope is not None:
        tasks = f"""(tenant, handoff_id) IN (
              SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
                  SELECT tenant, max(task_id) FROM {db}.handoff_summary
                  WHERE (tenant, handoff_id) IN ({scope}) GROUP BY tenant, handoff_id))"""
    return f"""SELECT tenant, handoff_id, h_created AS created, true AS bounce FROM (
    SELECT tenant, handoff_id, h_created, h_from, h_to,
        lagInFrame(h_from) OVER w AS prev_from, lagInFrame(h_to) OVER w AS prev_to,
        row_number() OVER w AS rn
    FROM (
        SELECT tenant, handoff_id, max(task_id) AS h_task, min(created) AS h_created,
            max(from_agent) AS h_from, max(to_agent) AS h_to
        FROM {db}.handoff_summary
        WHERE mode = 'transfer' AND created IS NOT NULL AND task_id != '' {tw}
          AND {tasks}
        GROUP BY tenant, handoff_id
    )
    WINDOW w AS (PARTITION BY tenant, h_task ORDER BY h_created, handoff_id
                 ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE rn > 1 AND h_from != '' AND prev_from = h_to AND prev_to = h_from
  AND {subject("h_created")}"""


#: pass name -> builder of the passes built here but the state pass (analytics._sql.settled:
#: from the settled flags and the live remainder); bounce reads handoff_summary only
STATE_PASSES: Final = {
    "idempotency": idempotency_pass,
    "fence": fence_pass,
    "retry": retry_pass,
    "causation": causation_pass,
    "bounce": bounce_pass,
}
