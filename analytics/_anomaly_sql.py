"""SQL of the anomaly kinds, grouped into passes: one query (one scan) per pass.

Each pass returns one row per flagged-or-candidate handoff: `handoff_id` plus one Bool
column per kind it computes (named after the kind). anomalies() aggregates a pass once for
all its kinds; anomaly_handoff_ids() selects one kind's column.

Why passes (bench/analytics_queries.py, 10M transitions / 2.67M handoffs): a query per kind
re-reads the cohort (handoff_summary FINAL) every time, and some kinds would re-read all
transitions twice (clock skew self-join) or window-sort every task (stale fence); 24 h took
~37 s that way. The passes:
  cohort       five kinds that are bit tests over the cohort's summary rows
  transitions  duplicate delivery + clock skew from ONE GROUP BY over the cohort's rows
               (IN on the primary-key prefix (tenant, handoff_id))
  fence        stale fence over only the rows that carry a fence token or state version
  bounce       over the summary's `transfer` create rows only
  spike        per-bucket rejection rates against a trailing baseline (_spike_sql.py)
  orphan       candidates from a cheap filter, checked exactly by key
  idempotency  create rows with a key and payload hash only
  envelope     the protocol audit of one handoff's own rows: receiver actor, grant, tenant
               claim (IN on the primary-key prefix)
  retry        attempts against their earlier attempts: blind retry, duplicate execution
               (summary rows of the cohort's idempotency keys and retry_of targets only)
  causation    consumers against the handoff they consume: verified, receipt expiry
  topology     each topology's own kinds from one scan of the cohort's create, accept,
               reject and executing rows (_topology_sql.py)
  fan_out      agent-as-tool fan-out over the cohort's summary rows (_topology_sql.py)
"""

from __future__ import annotations

from typing import Final

from analytics import _contract_sql as cs
from analytics import _topology_sql as topo
from analytics._common import Window, cohort_sql, ts
from analytics._spike_sql import (  # noqa: F401 (re-exported: the spike thresholds)
    SPIKE_BASELINE_FACTOR,
    SPIKE_MIN_RATE,
    SPIKE_MIN_SETTLED,
    spike_pass,
)
from collector import semconv

#: pass name -> the kinds (Bool columns) it returns, in ANOMALY_KINDS order of appearance.
PASSES: Final = {
    "cohort": (
        "invalid_transition",
        "committed_without_evidence",
        "unknown_unresolved",
        "accepted_never_started",
        "implied_accept",
    ),
    "transitions": ("duplicate_delivery", "clock_skew"),
    "idempotency": ("idempotency_conflict",),
    "fence": ("stale_fence",),
    "bounce": ("bounce",),
    "spike": ("rejection_spike",),
    "orphan": ("orphan_transition",),
    "retry": ("blind_retry", "duplicate_execution"),
    "causation": ("consumed_before_verified", "expired_receipt_used"),
    "envelope": (
        "wrong_consumer",
        "grant_expired",
        "capability_outside_grant",
        "grant_tenant_mismatch",
        "tenant_claim_mismatch",
    ),
    **topo.PASSES,
}
KIND_PASS: Final = {k: p for p, kinds in PASSES.items() for k in kinds}


def _ids(cohort: str) -> str:
    return f"(tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({cohort}))"


def _cohort_pass(db: str, window: Window, tenant: bool, sla_ms: int) -> str:
    now_ns = f"toUnixTimestamp64Nano({ts(window.clock())})"
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("uncounted", "t_unknown_in"))
    return f"""SELECT handoff_id,
    uncounted > 0 OR {cs.fork_condition()} OR {cs.after_terminal_condition()}
        AS invalid_transition,
    {cs.has("tmask", cs.COMMITTED_MASK)} AND NOT is_v AS committed_without_evidence,
    is_unresolved AND {now_ns} - toUnixTimestamp64Nano(assumeNotNull(t_unknown_in))
        > {int(sla_ms)} * 1000000 AS unknown_unresolved,
    is_a AND NOT {cs.has("tmask", cs.BEYOND_ACCEPTED_MASK)}
        AND {now_ns} - toUnixTimestamp64Nano(created) > deadline_eff * 1000000
        AS accepted_never_started,
    is_a AND NOT {cs.has("tmask", cs.ACCEPT_EVENT_MASK)} AS implied_accept
FROM ({cohort})"""


#: SQL of what makes two stored rows of one handoff and transition one span stored again
#: (reference.copy_key): the same span ids and time. A transport resend re-sends the same
#: bytes; an agent re-emitting a transition makes a new span (a new span id) at a new time.
COPY_KEY: Final = "trace_id, span_id, time"


def _transitions_pass_sql(db: str, window: Window, tenant: bool) -> str:
    """One GROUP BY per handoff over its rows (IN on the primary-key prefix).

    Duplicate delivery: a transition (event, from, to) stored as more than one copy
    (COPY_KEY): as two spans, or one span id at two times. A span stored again unchanged (an
    exporter's retry, a collector re-sending a batch) is one copy and is not flagged. The
    attribute maps are not compared: that reads every row's map, about twice this pass's
    time with realistic maps. Every other kind folds a span's differing copies
    idempotently (the funnel: the copy without evidence wins), and the evidence package
    lists each distinct content of a span with its arrivals.

    Clock skew: counted transitions x -> y (x.to = y.from, y not the way back, x before y in
    machine order) with y's earliest copy before x's earliest copy, over an array of the
    counted rows as (k, time ns), k packing the transition as integers: okey << 24 |
    event << 16 | from << 8 | to (1-based indexes, from 0 = create). When the times sorted
    by k never decrease nothing can be skewed (x sorts before y, and so do x's copies), so
    the quadratic lambdas run only on the others; copies change no earliest time."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=())
    states = [str(x) for x in cs.STATE_RANK]
    ev = sorted({e for _f, e, _t in cs.POSITIONS})
    names = "[" + ", ".join(f"'{x}'" for x in states) + "]"
    events = "[" + ", ".join(f"'{x}'" for x in ev) + "]"

    # code = event << 16 | from << 8 | to (1-based indexes; from 0 = create or a state not
    # in the contract, told apart by from_state = ''); k = okey << 24 | code for the
    # contract's codes, 0 for any other: one lookup per row finds legality and machine order
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

    # the parts of k in SQL
    def to_(v: str) -> str:
        return f"bitAnd({v}, 255)"

    def from_(v: str) -> str:
        return f"bitAnd(bitShiftRight({v}, 8), 255)"

    def okey(v: str) -> str:
        return f"bitShiftRight({v}, 24)"

    counted = f"k > 0 AND valid AND (from_state = '' OR {from_('k')} > 0)"
    follows = (
        f"{to_('x.1')} = {from_('y.1')} AND {to_('y.1')} != {from_('x.1')}"
        f" AND {okey('x.1')} < {okey('y.1')} AND y.2 < mx"
    )
    # m: earliest time of each row's transition (its copies included)
    m = "arrayMap(x -> arrayMin(z -> z.2, arrayFilter(z -> z.1 = x.1, c)), c)"
    monotone = "arrayAll(d -> d >= 0, arrayDifference(arrayMap(x -> x.2, arraySort(x -> x.1, c))))"
    return f"""SELECT handoff_id,
    length(arrayDistinct(v)) > length(arrayDistinct(arrayMap(x -> x.1, v))) AS duplicate_delivery,
    NOT {monotone}
        AND arrayExists((x, mx) -> arrayExists(y -> {follows}, c), c, {m}) AS clock_skew
FROM (
    SELECT tenant, handoff_id,
        groupArray((cityHash64(event, from_state, to_state), cityHash64({COPY_KEY}))) AS v,
        groupArrayIf((k, toUnixTimestamp64Nano(time)), {counted}) AS c
    FROM (
        SELECT tenant, handoff_id, valid, time, event, from_state, to_state, trace_id, span_id,
            transform(toUInt32(indexOf({events}, event) * 65536
                               + indexOf({names}, from_state) * 256 + indexOf({names}, to_state)),
                      {codes}, {keys}, toUInt64(0)) AS k
        FROM {db}.handoff_transitions
        WHERE {_ids(cohort)}
    )
    GROUP BY tenant, handoff_id
)
WHERE duplicate_delivery OR clock_skew"""


def _idempotency_pass(db: str, window: Window, tenant: bool) -> str:
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=())
    tw = "AND tenant = {tenant:String}" if tenant else ""
    return f"""SELECT DISTINCT handoff_id, true AS idempotency_conflict
FROM {db}.handoff_transitions
WHERE event = 'create' AND idempotency_key != '' AND {_ids(cohort)}
  AND (tenant, idempotency_key) IN (
    SELECT tenant, idempotency_key FROM {db}.handoff_transitions
    WHERE event = 'create' AND idempotency_key != '' AND payload_hash != '' {tw}
    GROUP BY tenant, idempotency_key HAVING uniqExact(payload_hash) > 1)"""


def _fence_pass(db: str, window: Window, tenant: bool) -> str:
    """Rows with neither a fence token nor a state version cannot be stale nor raise an
    earlier maximum (max ignores NULL), so the window runs over the others only."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("task_id",))
    return f"""SELECT DISTINCT handoff_id, true AS stale_fence FROM (
    SELECT tenant, handoff_id, event, fence_token, state_version,
        max(fence_token) OVER w AS prev_fence, max(state_version) OVER w AS prev_version
    FROM {db}.handoff_transitions
    WHERE (fence_token IS NOT NULL OR state_version IS NOT NULL)
      AND (tenant, task_id) IN (SELECT tenant, task_id FROM ({cohort}))
    WINDOW w AS (PARTITION BY tenant, task_id ORDER BY time, span_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
WHERE event IN ('commit', 'resolve_committed') AND {_ids(cohort)}
  AND (coalesce(fence_token < prev_fence, false) OR coalesce(state_version < prev_version, false))"""


def _bounce_pass(db: str, window: Window, tenant: bool) -> str:
    """Only a handoff's create row carries its mode (and created time), so the summary's
    rows with mode 'transfer' are exactly the transfer handoffs' create rows."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("task_id",))
    return f"""SELECT handoff_id, true AS bounce FROM (
    SELECT tenant, handoff_id, h_from, h_to,
        lagInFrame(h_from) OVER w AS prev_from, lagInFrame(h_to) OVER w AS prev_to,
        row_number() OVER w AS rn
    FROM (
        SELECT tenant, handoff_id, max(task_id) AS h_task, min(created) AS h_created,
            max(from_agent) AS h_from, max(to_agent) AS h_to
        FROM {db}.handoff_summary
        WHERE mode = 'transfer' AND created IS NOT NULL
          AND (tenant, task_id) IN (SELECT tenant, task_id FROM ({cohort}) WHERE mode = 'transfer')
        GROUP BY tenant, handoff_id
    )
    WINDOW w AS (PARTITION BY tenant, h_task ORDER BY h_created, handoff_id
                 ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE rn > 1 AND h_from != '' AND prev_from = h_to AND prev_to = h_from
  AND {_ids(cohort)}"""


def _orphan_pass(db: str, window: Window, tenant: bool) -> str:
    """A handoff whose rows all lack `created` and whose earliest row is in the window: the
    row holding that minimum is itself a created-less row first seen in the window, so such
    rows are the candidates; the exact test then reads only their keys."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    lo, hi = ts(window.start), ts(window.end)
    return f"""SELECT handoff_id, true AS orphan_transition FROM {db}.handoff_summary
WHERE (tenant, handoff_id) IN (
    SELECT tenant, handoff_id FROM {db}.handoff_summary
    WHERE created IS NULL AND first_seen >= {lo} AND first_seen < {hi} {tw})
GROUP BY tenant, handoff_id
HAVING min(created) IS NULL AND min(first_seen) >= {lo} AND min(first_seen) < {hi}"""


#: events the receiver (the envelope's to_agent) emits: another actor is a wrong consumer
RECEIVER_EVENTS: Final = ("accept", "reject", "start", "prepare", "commit", "fail")
#: events that use the grant: after its expiry they are grant_expired
GRANT_USE_EVENTS: Final = ("start", "prepare", "commit")
#: events that issue a receipt (and its expiry)
RECEIPT_EVENTS: Final = ("commit", "resolve_committed")
#: the handoff's envelope rows: a counted create (as handoff_summary's `created`)
IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"


def _tuple(items) -> str:
    return "(" + ", ".join(f"'{x}'" for x in items) + ")"


def _attr(name: str) -> str:
    """SQL of one span attribute (the name from collector.semconv, a constant: no injection)."""
    return f"attributes['{name}']"


def _iso(expr: str) -> str:
    """An ISO-8601 UTC text as DateTime64(9); NULL when empty or not a time."""
    return f"parseDateTime64BestEffortOrNull(nullIf({expr}, ''), 9, 'UTC')"


def _envelope_pass(db: str, window: Window, tenant: bool) -> str:
    """Per cohort handoff, over its own rows: its envelope (the greatest value over its
    counted create rows, as handoff_summary) against its other rows. The grant's
    capabilities are JSON text in the attribute map (an OTLP string[] value)."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=())
    gcap = semconv.GRANT_CAPABILITIES
    return f"""SELECT handoff_id,
    h_to != '' AND arrayExists(a -> a != h_to, recv_actors) AS wrong_consumer,
    g_exp IS NOT NULL AND t_use IS NOT NULL AND t_use > g_exp AS grant_expired,
    has_gcaps AND NOT hasAll(JSONExtract(g_caps, 'Array(String)'), h_caps)
        AS capability_outside_grant,
    g_tenant != '' AND g_tenant != tenant AS grant_tenant_mismatch,
    claim_mismatch AS tenant_claim_mismatch
FROM (
    SELECT tenant, handoff_id,
        maxIf(to_agent, {IS_CREATE}) AS h_to,
        maxIf(CAST(capabilities, 'Array(String)'), {IS_CREATE}) AS h_caps,
        countIf({IS_CREATE} AND mapContains(attributes, '{gcap}')) > 0 AS has_gcaps,
        maxIf({_attr(gcap)}, {IS_CREATE} AND mapContains(attributes, '{gcap}')) AS g_caps,
        maxIf({_attr(semconv.GRANT_TENANT)}, {IS_CREATE}) AS g_tenant,
        {_iso(f"maxIf({_attr(semconv.GRANT_EXPIRES_AT)}, {IS_CREATE})")} AS g_exp,
        groupUniqArrayIf(CAST(actor, 'String'), event IN {_tuple(RECEIVER_EVENTS)}) AS recv_actors,
        maxIf(time, event IN {_tuple(GRANT_USE_EVENTS)}) AS t_use_raw,
        if(countIf(event IN {_tuple(GRANT_USE_EVENTS)}) > 0, t_use_raw, NULL) AS t_use,
        countIf(claimed_tenant != '' AND claimed_tenant != tenant) > 0 AS claim_mismatch
    FROM {db}.handoff_transitions
    WHERE {_ids(cohort)}
    GROUP BY tenant, handoff_id
)
WHERE wrong_consumer OR grant_expired OR capability_outside_grant OR grant_tenant_mismatch
   OR tenant_claim_mismatch"""


def _attempts_sql(db: str, where: str) -> str:
    """One row per handoff from handoff_summary (merged by GROUP BY): what the retry checks
    need. `where` selects summary rows (by tenant and task or key)."""
    return f"""SELECT tenant, handoff_id, max(task_id) AS task, max(to_agent) AS target,
        max(idempotency_key) AS idem, min(created) AS created,
        min(t_unknown_in) AS t_in, min(t_unknown_out) AS t_out, min(t_committed) AS t_commit
    FROM {db}.handoff_summary WHERE {where}
    GROUP BY tenant, handoff_id"""


def _retry_pass(db: str, window: Window, tenant: bool) -> str:
    """B (the cohort) against its earlier attempts A (any handoff of the same tenant: B's
    `retry_of`, or the same task, to_agent and idempotency key; for duplicate execution
    any handoff with B's key). Attempts come from handoff_summary: created, first entry
    into and first exit out of unknown, first entry into committed (counted rows). Only
    handoffs sharing a non-empty key or named by a `retry_of` can pair, so only their
    summary rows are read (a same-slot peer shares the key)."""
    cohort = cohort_sql(
        db,
        window,
        tenant_param=tenant,
        extra=("task_id", "to_agent", "idempotency_key", "t_committed"),
    )
    peers = _attempts_sql(
        db,
        "(tenant, idempotency_key) IN (SELECT tenant, idem FROM b WHERE idem != '')"
        " OR (tenant, handoff_id) IN (SELECT tenant, retry_of FROM retries)",
    )
    retries = f"""SELECT tenant, handoff_id, max({_attr(semconv.RETRY_OF)}) AS retry_of
    FROM {db}.handoff_transitions
    WHERE {IS_CREATE} AND mapContains(attributes, '{semconv.RETRY_OF}') AND {_ids(cohort)}
    GROUP BY tenant, handoff_id"""
    blind = "a.t_in IS NOT NULL AND a.t_in < b.created AND (a.t_out IS NULL OR a.t_out > b.created)"
    dup = (
        "b.t_commit IS NOT NULL AND a.t_commit IS NOT NULL"
        " AND (assumeNotNull(a.t_commit), a.handoff_id) < (assumeNotNull(b.t_commit), b.handoff_id)"
    )
    return f"""WITH b AS (SELECT tenant, handoff_id, task_id, to_agent, idempotency_key AS idem,
                 created, t_committed AS t_commit FROM ({cohort})),
    retries AS ({retries}),
    peers AS ({peers})
SELECT b.handoff_id AS handoff_id, {blind} AS blind_retry, false AS duplicate_execution
FROM retries AS r
JOIN b ON b.tenant = r.tenant AND b.handoff_id = r.handoff_id
JOIN peers AS a ON a.tenant = r.tenant AND a.handoff_id = r.retry_of
WHERE a.handoff_id != b.handoff_id AND {blind}
UNION ALL
SELECT b.handoff_id AS handoff_id, b.task_id = a.task AND b.to_agent = a.target
        AND {blind} AS blind_retry, {dup} AS duplicate_execution
FROM (SELECT * FROM b WHERE idem != '') AS b
JOIN (SELECT * FROM peers WHERE idem != '') AS a ON a.tenant = b.tenant AND a.idem = b.idem
WHERE a.handoff_id != b.handoff_id
  AND ((b.task_id = a.task AND b.to_agent = a.target AND {blind}) OR {dup})"""


def _causation_pass(db: str, window: Window, tenant: bool) -> str:
    """C (the cohort, with a causation_id naming a stored handoff A of its tenant) against
    A: C created before A's first counted verify (or A never verified), or after A's
    receipt expiry (the earliest `receipt.expires_at` on A's commit rows)."""
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=())
    consumers = f"""SELECT tenant, handoff_id, max({_attr(semconv.CAUSATION_ID)}) AS cause,
        min(time) AS created
    FROM {db}.handoff_transitions
    WHERE {IS_CREATE} AND mapContains(attributes, '{semconv.CAUSATION_ID}') AND {_ids(cohort)}
    GROUP BY tenant, handoff_id"""
    verify = "(valid AND event = 'verify' AND from_state = 'committed' AND to_state = 'verified')"
    receipt = f"valid AND event IN {_tuple(RECEIPT_EVENTS)}"
    return f"""WITH c AS ({consumers})
SELECT c.handoff_id AS handoff_id,
    a.t_verified IS NULL OR c.created < a.t_verified AS consumed_before_verified,
    a.r_exp IS NOT NULL AND c.created > a.r_exp AS expired_receipt_used
FROM c JOIN (
    SELECT tenant, handoff_id,
        minIf(time, {verify}) AS t_v, if(countIf({verify}) > 0, t_v, NULL) AS t_verified,
        minIf({_iso(_attr(semconv.RECEIPT_EXPIRES_AT))}, {receipt}) AS r_exp
    FROM {db}.handoff_transitions
    WHERE (tenant, handoff_id) IN (SELECT tenant, cause FROM c)
    GROUP BY tenant, handoff_id
) AS a ON a.tenant = c.tenant AND a.handoff_id = c.cause
WHERE c.cause != c.handoff_id"""


def pass_sql(name: str, db: str, window: Window, *, tenant: bool, sla_ms: int) -> str:
    """SQL of one pass (see module doc); ValueError for an unknown pass."""
    if name == "cohort":
        return _cohort_pass(db, window, tenant, sla_ms)
    builders = {
        "transitions": _transitions_pass_sql,
        "idempotency": _idempotency_pass,
        "fence": _fence_pass,
        "bounce": _bounce_pass,
        "spike": spike_pass,
        "orphan": _orphan_pass,
        "envelope": _envelope_pass,
        "retry": _retry_pass,
        "causation": _causation_pass,
        "topology": topo.topology_pass,
        "fan_out": topo.fan_out_pass,
    }
    if name not in builders:
        raise ValueError(f"unknown anomaly pass {name!r}")
    return builders[name](db, window, tenant)
