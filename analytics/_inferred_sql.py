"""SQL of the kinds inferred from what senders do, not what they declare: four passes of
analytics/_anomaly_sql.py, each one query, each returning tenant, handoff_id and one Bool per
kind, one row per flagged handoff of the cohort.

  refusal        retry_after_final_refusal: the counted rejects with a final code
                 (PREWHERE on the typed `event` and `error_code`), then by primary key the
                 handoffs naming them in retry_of (the state's column) or sharing their
                 tasks (handoff_tasks), their summary rows and create rows (objective hash,
                 retry_of)
  keyless        keyless_duplicate_write: the keyless create rows with a payload hash of a
                 shared-queue handoff or of a command (PREWHERE on typed columns and
                 topology_attrs), created from HANDOFFS_KEYLESS_WINDOW_S before the window
                 to its end, of (to_agent, payload hash) groups of two handoffs or more;
                 then their summary rows by primary key (commit, key)
  grant_checks   grant_caller_mismatch from the window's create rows carrying audit
                 attributes (PREWHERE on `audit_attrs`, sql/017); missing_grant (only with
                 HANDOFFS_REQUIRE_GRANTS=1) from the anomaly state's grant columns of the
                 cohort's rows asking for capabilities; then the candidates' create rows by
                 primary key
  version_order  out_of_order_version over the anomaly state's `fences` (the rows carrying
                 a fence token or state version) of the tasks of the cohort's versioned
                 handoffs

No pass scans every transition's attribute map. Definitions: docs/metrics.md; the oracle:
analytics/reference_inferred.py. Settings are read when the SQL is built (argument, then the
HANDOFFS_* variable, then the default: analytics.reference_inferred.policy).
"""

from __future__ import annotations

from typing import Final

from analytics._anomaly_state_passes import _candidates
from analytics._anomaly_state_sql import IS_CREATE, TABLE, sql_tuple
from analytics._common import Window, ts
from analytics._inferred_retry_sql import create_envelope_sql, rows_of
from analytics.reference_inferred import SIDE_EFFECT_KIND, SIDE_EFFECT_TOPOLOGY, Policy, policy
from collector import semconv

__all__ = [
    "BUILDERS",
    "PASSES",
    "grants_pass",
    "keyless_pass",
    "refusal_pass",
    "versions_pass",
]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {
    "refusal": ("retry_after_final_refusal",),
    "keyless": ("keyless_duplicate_write",),
    "grant_checks": ("grant_caller_mismatch", "missing_grant"),
    "version_order": ("out_of_order_version",),
}
_GRANT_PREFIX: Final = "handoff.grant."


def _tenant_and(tenant: bool) -> str:
    return "AND tenant = {tenant:String}" if tenant else ""


def _in(col: str, window: Window) -> str:
    return f"{col} IS NOT NULL AND {col} >= {ts(window.start)} AND {col} < {ts(window.end)}"


def _attr(name: str) -> str:
    return f"attributes['{name}']"


def refusal_pass(db: str, window: Window, tenant: bool) -> str:
    """retry_after_final_refusal: B of the cohort created after A's first counted reject
    with a final code (collector.semconv.FINAL_ERROR_CODES), B retrying A: B's retry_of
    names A, or B names none and has A's task (non-empty), from_agent, to_agent and
    objective hash (non-empty). A reject at or after the window's end can precede no cohort
    handoff, so the rejects are read up to it."""
    tw = _tenant_and(tenant)
    rejected = f"""SELECT tenant, handoff_id, min(time) AS t_rej FROM {db}.handoff_transitions
        PREWHERE event = 'reject' AND error_code IN {sql_tuple(semconv.FINAL_ERROR_CODES)}
        WHERE valid AND from_state = 'created' AND to_state = 'rejected'
          AND time < {ts(window.end)} {tw}
        GROUP BY tenant, handoff_id"""
    refused = f"SELECT tenant, handoff_id FROM ({rejected})"
    involved = f"""SELECT tenant, handoff_id FROM {db}.{TABLE}
        WHERE retry_of != '' {tw} AND (tenant, retry_of) IN ({refused})
        UNION ALL
        SELECT tenant, handoff_id FROM {db}.handoff_tasks
        WHERE (tenant, task_id) IN (
            SELECT tenant, task_id FROM {db}.handoff_summary
            WHERE task_id != '' AND (tenant, handoff_id) IN ({refused}))"""

    def summaries(keys: str, having: str = "1") -> str:
        return f"""SELECT tenant, handoff_id, max(task_id) AS task, max(from_agent) AS src,
            max(to_agent) AS dst, min(created) AS created
        FROM {db}.handoff_summary WHERE (tenant, handoff_id) IN ({keys})
        GROUP BY tenant, handoff_id HAVING {having}"""

    # A: the refused attempts with their slot and objective hash; B: the cohort's handoffs
    # that name one in retry_of or share its task, with their envelope. Two equi-joins (the
    # declared link, the inferred one): the work follows the refused attempts and their
    # tasks, never their product.
    attempts_a = f"""SELECT r.tenant AS tenant, r.handoff_id AS a_id, r.t_rej AS t_rej,
            s.task AS task, s.src AS src, s.dst AS dst, c.oh AS oh
        FROM ({rejected}) AS r
        INNER JOIN ({summaries(refused)}) AS s ON s.tenant = r.tenant AND s.handoff_id = r.handoff_id
        LEFT JOIN ({create_envelope_sql(db, refused)}) AS c
            ON c.tenant = r.tenant AND c.handoff_id = r.handoff_id"""
    cohort_b = summaries(involved, _in("created", window))
    attempts_b = f"""SELECT b.tenant AS tenant, b.handoff_id AS b_id, b.created AS created,
            b.task AS task, b.src AS src, b.dst AS dst, c.oh AS oh, c.rof AS rof
        FROM ({cohort_b}) AS b
        INNER JOIN ({create_envelope_sql(db, f"SELECT tenant, handoff_id FROM ({cohort_b})")}) AS c
            ON c.tenant = b.tenant AND c.handoff_id = b.handoff_id"""
    return f"""SELECT DISTINCT tenant, handoff_id, true AS retry_after_final_refusal FROM (
    SELECT b.tenant AS tenant, b.b_id AS handoff_id
    FROM ({attempts_b}) AS b INNER JOIN ({attempts_a}) AS a
        ON a.tenant = b.tenant AND a.a_id = b.rof
    WHERE b.b_id != a.a_id AND b.created > a.t_rej
    UNION ALL
    SELECT b.tenant AS tenant, b.b_id AS handoff_id
    FROM ({attempts_b}) AS b INNER JOIN ({attempts_a}) AS a
        ON a.tenant = b.tenant AND a.task = b.task AND a.src = b.src AND a.dst = b.dst
            AND a.oh = b.oh
    WHERE b.rof = '' AND b.task != '' AND b.oh != '' AND b.b_id != a.a_id
        AND b.created > a.t_rej
)
"""


def keyless_pass(db: str, window: Window, tenant: bool, pol: Policy | None = None) -> str:
    """keyless_duplicate_write: among the committed side-effecting writes (a command, or any
    handoff on the shared_queue topology) without an idempotency key and with a payload
    hash, per (tenant, to_agent, payload hash) in (created, handoff_id) order, each write
    created at most the window (HANDOFFS_KEYLESS_WINDOW_S) after the one before it; the
    first of a group is not flagged. Writes created from one window before the cohort's
    start can precede a cohort write; none later than its end matters."""
    pol = pol or policy()
    tw = _tenant_and(tenant)
    w_ns = pol.keyless_window_s * 1_000_000_000
    lo = f"{ts(window.start)} - toIntervalSecond({pol.keyless_window_s})"
    kind = _attr(semconv.MESSAGE_KIND)
    # the keyless side-effecting creates with a payload hash, only those of a (to_agent,
    # payload hash) held by two handoffs or more: a constant, so one scan
    groups = f"""SELECT tenant, to_agent AS dst, payload_hash AS ph,
            groupUniqArray(handoff_id) AS hs
        FROM {db}.handoff_transitions
        PREWHERE event = 'create' AND payload_hash != '' AND idempotency_key = ''
            AND (topology = '{SIDE_EFFECT_TOPOLOGY}' OR topology_attrs)
        WHERE {IS_CREATE} AND time >= {lo} AND time < {ts(window.end)} {tw}
          AND (topology = '{SIDE_EFFECT_TOPOLOGY}' OR {kind} = '{SIDE_EFFECT_KIND}')
        GROUP BY tenant, dst, ph
        HAVING length(hs) > 1"""
    writes = f"""SELECT tenant, dst, ph, arrayJoin(hs) AS handoff_id FROM ({groups})"""
    members = f"""SELECT k.tenant AS tenant, k.handoff_id AS handoff_id, s.dst AS dst,
            k.ph AS ph, s.created AS created
        FROM (SELECT w.2 AS ph, w.3 AS tenant, w.4 AS handoff_id
              FROM (SELECT arrayJoin(keyless) AS w)) AS k
        INNER JOIN (
            SELECT tenant, handoff_id, min(created) AS created, min(t_committed) AS t_commit,
                max(idempotency_key) AS idem, max(to_agent) AS dst
            FROM {db}.handoff_summary
            WHERE (tenant, handoff_id) IN ({rows_of("keyless", 3, 4)})
            GROUP BY tenant, handoff_id
        ) AS s ON s.tenant = k.tenant AND s.handoff_id = k.handoff_id
        WHERE notEmpty(keyless) AND s.t_commit IS NOT NULL AND s.idem = ''
          AND s.created IS NOT NULL"""
    return f"""WITH (SELECT groupArray((dst, ph, tenant, handoff_id)) FROM ({writes})) AS keyless
SELECT tenant, handoff_id, true AS keyless_duplicate_write FROM (
    SELECT tenant, handoff_id, created,
        lagInFrame(created) OVER w AS prev_created, row_number() OVER w AS rn
    FROM ({members})
    WINDOW w AS (PARTITION BY tenant, dst, ph ORDER BY created, handoff_id
                 ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE rn > 1 AND {_in("created", window)}
  AND toUnixTimestamp64Nano(created) - toUnixTimestamp64Nano(prev_created) <= {w_ns}"""


def grants_pass(db: str, window: Window, tenant: bool, pol: Policy | None = None) -> str:
    """grant_caller_mismatch: the grant's caller (the greatest over the counted create rows)
    is set and is not the envelope's from_agent. missing_grant (only when the policy
    requires grants): capabilities asked for, and no counted create row carries any
    `handoff.grant.*` attribute. Candidates: create rows of the window carrying audit
    attributes whose caller differs from the row's from_agent; the state rows of the cohort
    asking for capabilities without a grant's capabilities, tenant or expiry. Their create
    rows are then read by primary key and judged exactly."""
    pol = pol or policy()
    tw = _tenant_and(tenant)
    caller = _attr(semconv.GRANT_CALLER)
    callers = f"""SELECT tenant, handoff_id FROM {db}.handoff_transitions
        PREWHERE audit_attrs AND event = 'create'
        WHERE time >= {ts(window.start)} AND time < {ts(window.end)} {tw}
          AND {caller} != '' AND {caller} != from_agent"""
    parts = [callers]
    if pol.require_grants:
        parts.append(
            f"""SELECT tenant, handoff_id FROM {db}.{TABLE}
        WHERE notEmpty(capabilities) AND grant_capabilities IS NULL AND grant_tenant = ''
          AND grant_expires_at = '' AND {_in("created", window)} {tw}"""
        )
    candidates = "\n        UNION ALL\n        ".join(parts)
    granted = f"arrayExists(k -> startsWith(k, '{_GRANT_PREFIX}'), mapKeys(attributes))"
    missing = "notEmpty(caps) AND NOT granted" if pol.require_grants else "false"
    return f"""SELECT tenant, handoff_id,
    caller != '' AND caller != src AS grant_caller_mismatch,
    {missing} AS missing_grant
FROM (
    SELECT tenant, handoff_id, min(time) AS created, max({caller}) AS caller,
        max(from_agent) AS src, max(CAST(capabilities, 'Array(String)')) AS caps,
        countIf({granted}) > 0 AS granted
    FROM {db}.handoff_transitions
    PREWHERE event = 'create'
    WHERE {IS_CREATE} AND (tenant, handoff_id) IN ({candidates})
    GROUP BY tenant, handoff_id
)
WHERE {_in("created", window)} AND (grant_caller_mismatch OR missing_grant)"""


def versions_pass(db: str, window: Window, tenant: bool) -> str:
    """out_of_order_version: a cohort handoff with a row (any event) whose state_version is
    below the greatest a row of the same task (tenant, the row's task_id) carried at a
    strictly earlier time; over the stored rows with a state version of the tasks of the
    cohort's versioned handoffs (the anomaly state's `fences`)."""
    tw = _tenant_and(tenant)
    cand = _candidates(db, window, tenant, "notEmpty(fences)", "groupUniqArrayArray(fences) AS fs")
    versioned = "arrayFilter(r -> r.6 IS NOT NULL, fs)"
    return f"""WITH c AS (SELECT tenant, handoff_id, arrayJoin({versioned}).3 AS task FROM ({cand}))
SELECT DISTINCT tenant, handoff_id, true AS out_of_order_version FROM (
    SELECT tenant, handoff_id, version,
        max(version) OVER (PARTITION BY tenant, task ORDER BY t_ns
                           RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_version
    FROM (
        SELECT tenant, handoff_id, toUnixTimestamp64Nano(r.1) AS t_ns, r.3 AS task,
            r.6 AS version
        FROM (SELECT tenant, handoff_id, arrayJoin(fences) AS r
              FROM {db}.{TABLE} WHERE notEmpty(fences) {tw})
        WHERE r.6 IS NOT NULL AND (tenant, task) IN (SELECT tenant, task FROM c)
    )
)
WHERE (tenant, handoff_id) IN (SELECT tenant, handoff_id FROM c)
  AND coalesce(version < prev_version, false)"""


#: pass name -> builder (db, window, tenant) -> SQL
BUILDERS: Final = {
    "refusal": refusal_pass,
    "keyless": keyless_pass,
    "grant_checks": grants_pass,
    "version_order": versions_pass,
}
