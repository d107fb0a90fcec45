"""SQL of the kinds inferred from what senders do, not what they declare: four passes of
analytics/_sql/anomalies.py, each one query, each returning tenant, handoff_id and one Bool per
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
analytics/oracle/inferred.py. Settings are read when the SQL is built (argument, then the
HANDOFFS_* variable, then the default: analytics._sql.inferred_policy.policy).
"""

from __future__ import annotations

from typing import Final

from analytics._sql.anomaly_state import IS_CREATE, TABLE, sql_tuple
from analytics._sql.cohort import Window, ts
from analytics._sql.inferred_policy import SIDE_EFFECT_KIND, SIDE_EFFECT_TOPOLOGY, Policy, policy
from analytics._sql.inferred_retry import create_envelope_sql, rows_of
from analytics._sql.state_passes import _candidates
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


def refusal_pass(db: str, window: Window, tenant: bool, keys: str | None = None) -> str:
    """retry_after_final_refusal: B of the cohort created after A's first counted reject
    with a final code (collector.semconv.FINAL_ERROR_CODES), B retrying A: B's retry_of
    names A, or B names none and has A's task (non-empty), from_agent, to_agent and
    objective hash (non-empty). A reject at or after the window's end can precede no cohort
    handoff, so the rejects are read up to it. `keys` (SQL of (tenant, handoff_id) rows):
    only those are judged as B, and only the rejects of their tasks and of the handoffs
    their retry_of names are read.

    Cost: the pairs are formed from typed columns (the rejects' `event` and `error_code`,
    the state's `retry_of`, the summary rows of the refused attempts' tasks, grouped per
    (task, from_agent, to_agent) in memory); only the paired handoffs' create rows are read
    for the objective hash and retry_of. Each set is read once into a constant: a subquery
    named in several places would be evaluated in each."""
    tw = _tenant_and(tenant)
    only_a = of_keys = ""
    if keys is not None:
        of_keys = f"AND (tenant, handoff_id) IN ({keys})"
        only_a = f"""AND (tenant, handoff_id) IN (
            SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
                SELECT tenant, task_id FROM {db}.handoff_summary
                WHERE task_id != '' AND (tenant, handoff_id) IN ({keys}))
            UNION ALL
            SELECT tenant, retry_of FROM {db}.{TABLE}
            WHERE retry_of != '' AND (tenant, handoff_id) IN ({keys}))"""
    rejected = f"""SELECT tenant, handoff_id, min(time) AS t_rej FROM {db}.handoff_transitions
        PREWHERE event = 'reject' AND error_code IN {sql_tuple(semconv.FINAL_ERROR_CODES)}
        WHERE valid AND from_state = 'created' AND to_state = 'rejected'
          AND time < {ts(window.end)} {tw} {only_a}
        GROUP BY tenant, handoff_id"""
    refused = rows_of("ref_rej", 1, 2)
    rej = "SELECT r.1 AS tenant, r.2 AS a_id, r.3 AS t_rej FROM (SELECT arrayJoin(ref_rej) AS r)"
    declaring = f"""SELECT DISTINCT tenant, handoff_id, retry_of FROM {db}.{TABLE}
        WHERE retry_of != '' {tw} {of_keys} AND (tenant, retry_of) IN ({refused})"""
    slots = f"""SELECT tenant, handoff_id, max(task_id) AS task, max(from_agent) AS src,
            max(to_agent) AS dst, min(created) AS created
        FROM {db}.handoff_summary
        WHERE (tenant, handoff_id) IN (
            SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
                SELECT tenant, task_id FROM {db}.handoff_summary
                WHERE task_id != '' AND (tenant, handoff_id) IN ({refused}))
            UNION ALL
            SELECT d.1, d.2 FROM (SELECT arrayJoin(ref_decl) AS d))
        GROUP BY tenant, handoff_id"""
    slot = """SELECT s.1 AS tenant, s.2 AS id, s.3 AS task, s.4 AS src, s.5 AS dst,
            s.6 AS created FROM (SELECT arrayJoin(ref_slot) AS s)"""
    # a B candidate: created in the window (and one of `keys`)
    is_b = _in("s.created", window) + (
        f" AND (s.tenant, s.id) IN ({keys})" if keys is not None else ""
    )
    declared = f"""SELECT d.1 AS tenant, d.2 AS b_id, d.3 AS a_id, r.t_rej AS t_rej,
            true AS declared
        FROM (SELECT arrayJoin(ref_decl) AS d) AS x
        INNER JOIN ({rej}) AS r ON r.tenant = d.1 AND r.a_id = d.3
        INNER JOIN ({slot}) AS s ON s.tenant = d.1 AND s.id = d.2
        WHERE {_in("s.created", window)} AND s.created > r.t_rej AND d.2 != d.3"""
    inferred = f"""SELECT tenant, b.1 AS b_id, a.1 AS a_id, assumeNotNull(a.3) AS t_rej,
            false AS declared
        FROM (
            SELECT s.tenant AS tenant,
                groupArray((s.id, s.created, if(r.a_id != '', r.t_rej, NULL), {is_b})) AS hs
            FROM ({slot}) AS s
            LEFT JOIN ({rej}) AS r ON r.tenant = s.tenant AND r.a_id = s.id
            WHERE s.task != ''
            GROUP BY s.tenant, s.task, s.src, s.dst
            HAVING count() > 1 AND countIf(r.a_id != '') > 0
        )
        ARRAY JOIN hs AS b
        ARRAY JOIN hs AS a
        WHERE b.4 AND a.3 IS NOT NULL AND a.1 != b.1 AND b.2 > a.3"""
    paired = f"{rows_of('ref_pairs', 1, 2)} UNION ALL {rows_of('ref_pairs', 1, 3)}"
    env = """SELECT e.1 AS tenant, e.2 AS id, e.3 AS oh, e.4 AS rof
        FROM (SELECT arrayJoin(ref_env) AS e)"""
    return f"""WITH (SELECT groupArray((tenant, handoff_id, t_rej)) FROM ({rejected})) AS ref_rej,
    (SELECT groupArray((tenant, handoff_id, retry_of)) FROM ({declaring})) AS ref_decl,
    (SELECT groupArray((tenant, handoff_id, task, src, dst, created)) FROM ({slots})) AS ref_slot,
    (SELECT groupArray((tenant, b_id, a_id, declared))
     FROM ({declared} UNION ALL {inferred})) AS ref_pairs,
    (SELECT groupArray((tenant, handoff_id, oh, rof))
     FROM ({create_envelope_sql(db, paired)})) AS ref_env
SELECT DISTINCT p.1 AS tenant, p.2 AS handoff_id, true AS retry_after_final_refusal
FROM (SELECT arrayJoin(ref_pairs) AS p) AS x
INNER JOIN ({env}) AS eb ON eb.tenant = p.1 AND eb.id = p.2
LEFT JOIN ({env}) AS ea ON ea.tenant = p.1 AND ea.id = p.3
WHERE (p.4 AND eb.rof = p.3)
   OR (NOT p.4 AND eb.rof = '' AND eb.oh != '' AND eb.oh = ea.oh)
"""


def keyless_pass(
    db: str,
    window: Window,
    tenant: bool,
    pol: Policy | None = None,
    keys: str | None = None,
    *,
    gaps: bool = False,
) -> str:
    """keyless_duplicate_write: among the committed side-effecting writes (a command, or any
    handoff on the shared_queue topology) without an idempotency key and with a payload
    hash, per (tenant, to_agent, payload hash) in (created, handoff_id) order, each write
    created at most the window (HANDOFFS_KEYLESS_WINDOW_S) after the one before it; the
    first of a group is not flagged. Writes created from one window before the cohort's
    start can precede a cohort write; none later than its end matters. `keys` (SQL of
    (tenant, handoff_id) rows): only those judged, only their groups read. With `gaps`,
    every write of the cohort after the first of its group, flagged or not, with
    `keyless_gap_ns` (ns since the write before it): the kind for any window length."""
    pol = pol or policy()
    tw = _tenant_and(tenant)
    w_ns = pol.keyless_window_s * 1_000_000_000
    lo = f"{ts(window.start)} - toIntervalSecond({pol.keyless_window_s})"
    kind = _attr(semconv.MESSAGE_KIND)
    of_groups = of_keys = ""
    if keys is not None:
        of_keys = f"AND (tenant, handoff_id) IN ({keys})"
        # only the writes that can precede one of `keys` by the window or less: an earlier
        # one ends the group (its gap is over the window, so no kind at any shorter one)
        mine = f"""SELECT tenant, to_agent, payload_hash, time FROM {db}.handoff_transitions
            PREWHERE event = 'create' AND payload_hash != ''
            WHERE (tenant, handoff_id) IN ({keys})"""
        lo = f"(SELECT min(time) FROM ({mine})) - toIntervalSecond({pol.keyless_window_s})"
        of_groups = f"""AND (tenant, to_agent, payload_hash) IN (
            SELECT tenant, to_agent, payload_hash FROM ({mine}))"""
    gap = "toUnixTimestamp64Nano(created) - toUnixTimestamp64Nano(prev_created)"
    kind_col, within = (
        (f"{gap} AS keyless_gap_ns", "")
        if gaps
        else ("true AS keyless_duplicate_write", f"AND {gap} <= {w_ns}")
    )
    # the keyless side-effecting creates with a payload hash, only those of a (to_agent,
    # payload hash) held by two handoffs or more: a constant, so one scan
    groups = f"""SELECT tenant, to_agent AS dst, payload_hash AS ph,
            groupUniqArray(handoff_id) AS hs
        FROM {db}.handoff_transitions
        PREWHERE event = 'create' AND payload_hash != '' AND idempotency_key = ''
            AND (topology = '{SIDE_EFFECT_TOPOLOGY}' OR topology_attrs)
        WHERE {IS_CREATE} AND time >= {lo} AND time < {ts(window.end)} {tw} {of_groups}
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
SELECT tenant, handoff_id, {kind_col} FROM (
    SELECT tenant, handoff_id, created,
        lagInFrame(created) OVER w AS prev_created, row_number() OVER w AS rn
    FROM ({members})
    WINDOW w AS (PARTITION BY tenant, dst, ph ORDER BY created, handoff_id
                 ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE rn > 1 AND {_in("created", window)} {of_keys} {within}"""


def grants_pass(
    db: str, window: Window, tenant: bool, pol: Policy | None = None, keys: str | None = None
) -> str:
    """grant_caller_mismatch: the grant's caller (the greatest over the counted create rows)
    is set and is not the envelope's from_agent. missing_grant (only when the policy
    requires grants): capabilities asked for, and no counted create row carries any
    `handoff.grant.*` attribute. Candidates: create rows of the window carrying audit
    attributes whose caller differs from the row's from_agent; the state rows of the cohort
    asking for capabilities without a grant's capabilities, tenant or expiry. Their create
    rows are then read by primary key and judged exactly. `keys` (SQL of (tenant,
    handoff_id) rows): only those judged and read."""
    pol = pol or policy()
    tw = _tenant_and(tenant)
    if keys is not None:
        tw += f" AND (tenant, handoff_id) IN ({keys})"
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
