"""SQL of the evidence checks per handoff: does the result meet the evidence policy and the
reply contract its envelope declares (docs/metrics.md, "Evidence checks")?

One query shape serves two readers: the cohort's V(h) (analytics._sql.cohort.cohort_sql: a
result counts as evidenced only when the emitter marked it valid and these checks pass)
and the `evidence` anomaly pass (analytics/_sql/evidence_checks.py). Both read only the
handoffs that declare a check: their create rows are found by PREWHERE on the typed
`audit_attrs` flag (sql/017) and `event`, so the attribute map is read for those rows only;
then those handoffs' create and result rows by the primary key's prefix (tenant,
handoff_id). With no handoff declaring a check, both reads are empty (the flag column of
the window's rows is all that is read); the shells ask that first (`declared_sql`, one read
stopping at the first declaring row) and then leave the checks out of their SQL altogether
(analytics._sql.cohort.Window.checks_absent_since), so such a store pays one small query.

Per handoff (envelope values from its counted create rows, the greatest when several
disagree; times ISO-8601, a value that is not one is absent):
  out_of_window  a window is declared (valid_after and/or valid_before) and a ref of the
                 first result transition has a valid_at outside [valid_after, valid_before),
                 or none that reads as a time
  below_policy   the first result transition carries fewer distinct refs than min_refs, or
                 with require_claims a ref without a claim
  contract_unmet must_return is declared and a name of it is in no counted result row's
                 result.fields (prepare, commit, resolve_committed: their union)
The first result transition is the one V(h) reads: the counted result rows with the least
machine order (analytics._sql.contract.order_key); a check fails when it fails on any of its
rows (copies and re-emissions included), as V(h) takes the row without evidence.
The reference: analytics/oracle/evidence.py.
"""

from __future__ import annotations

from typing import Final

from analytics._sql import contract as cs
from collector import semconv as sc
from collector.contract import RESULT_EVENTS

__all__ = ["POLICY_KEYS", "checks_sql", "declared_sql", "failed_sql", "iso_time_sql"]

#: the create attributes that declare a check (a subset of sql/017's AUDIT_KEYS)
POLICY_KEYS: Final = (
    sc.EVIDENCE_POLICY_VALID_AFTER,
    sc.EVIDENCE_POLICY_VALID_BEFORE,
    sc.EVIDENCE_POLICY_MIN_REFS,
    sc.EVIDENCE_POLICY_REQUIRE_CLAIMS,
    sc.REPLY_CONTRACT_MUST_RETURN,
)
_IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"
_RESULT_LIST: Final = ", ".join(f"'{e}'" for e in sorted(map(str, RESULT_EVENTS)))
#: a time is read only when it starts like ISO-8601 (a date, then T): best-effort parsing
#: alone would read a bare number as a Unix time
_ISO_PREFIX: Final = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T"


def iso_time_sql(expr: str) -> str:
    """SQL Nullable(DateTime64(9, 'UTC')) of an ISO-8601 text (no offset = UTC); NULL when
    empty or not such a time."""
    return (
        f"if(match({expr}, '{_ISO_PREFIX}'), "
        f"parseDateTime64BestEffortOrNull({expr}, 9, 'UTC'), NULL)"
    )


def _attr(name: str) -> str:
    return f"attributes['{name}']"


def _strings(name: str) -> str:
    return f"JSONExtract({_attr(name)}, 'Array(String)')"


def _result_key() -> str:
    """SQL over a row: the machine order (order_key) of a counted result transition, 0 for
    any other row. Only the few legal result transitions are listed: a smaller expression
    than the whole contract table's, which the cohort (the funnel) plans on every query."""
    keys = {f"{f}|{e}|{t}": cs.order_key(f, t) for f, e, t in cs.POSITIONS if e in RESULT_EVENTS}
    names = "[" + ", ".join(f"'{k}'" for k in keys) + "]"
    values = "[" + ", ".join(str(v) for v in keys.values()) + "]"
    row = "concat(from_state, '|', event, '|', to_state)"
    return f"if(valid, transform({row}, {names}, {values}, 0), 0)"


def _declaring(db: str, since: str, tenant_and: str, within: str | None = None) -> str:
    """SQL of (tenant, handoff_id) of the create rows at or after `since` carrying a check's
    attribute (of the handoffs of `within`, SQL of (tenant, handoff_id) rows, when given):
    PREWHERE on the typed flag, so the map is read for flagged rows only."""
    keys = "[" + ", ".join(f"'{k}'" for k in POLICY_KEYS) + "]"
    of = f" AND (tenant, handoff_id) IN ({within})" if within else ""
    return f"""SELECT tenant, handoff_id FROM {db}.handoff_transitions
            PREWHERE audit_attrs AND event = 'create'
            WHERE time >= {since} {tenant_and}{of} AND hasAny(mapKeys(attributes), {keys})"""


def declared_sql(db: str, since: str) -> str:
    """SQL of one row (1) when some create row at or after `since` (any tenant) declares a
    check, none else; the read stops at the first. Without one, a cohort starting at or
    after `since` has nothing to check (analytics._sql.cohort.Window.checks_absent_since)."""
    return f"SELECT 1 FROM ({_declaring(db, since, '')}) LIMIT 1"


def checks_sql(db: str, since: str, tenant_and: str = "", within: str | None = None) -> str:
    """SQL of one row per handoff with a create row carrying a check's attribute, timed at or
    after `since` (a DateTime64 SQL literal: every create row of a handoff created in a
    window starting there is): tenant, handoff_id, out_of_window, below_policy,
    contract_unmet (Bool; module doc). `tenant_and`: a condition on `tenant` ("AND ...");
    `within`: SQL of (tenant, handoff_id) rows, the only handoffs read (None: all)."""
    per_row = (
        "(rkey, "
        f"arrayMap(i -> {iso_time_sql('arrayElement(valid_at, i)')}, "
        "arrayEnumerate(evidence_refs)), "
        "length(arrayDistinct(arrayFilter(x -> x != '', evidence_refs))), "
        "arrayExists(i -> arrayElement(claims, i) = '', arrayEnumerate(evidence_refs)))"
    )
    must = sc.REPLY_CONTRACT_MUST_RETURN
    outside = "isNull(t) OR ifNull(t < p_after, false) OR ifNull(t >= p_before, false)"
    return f"""SELECT tenant, handoff_id,
    (p_after IS NOT NULL OR p_before IS NOT NULL)
        AND arrayExists(r -> r.1 = first_key AND arrayExists(t -> {outside}, r.2), results)
        AS out_of_window,
    arrayExists(r -> r.1 = first_key
        AND (ifNull(r.3 < p_min, false) OR (p_claims AND r.4)), results) AS below_policy,
    has_must AND NOT hasAll(fields, JSONExtract(must_text, 'Array(String)')) AS contract_unmet
FROM (
    SELECT tenant, handoff_id,
        maxIf({iso_time_sql(_attr(sc.EVIDENCE_POLICY_VALID_AFTER))}, is_create) AS p_after,
        maxIf({iso_time_sql(_attr(sc.EVIDENCE_POLICY_VALID_BEFORE))}, is_create) AS p_before,
        maxIf(toInt64OrNull({_attr(sc.EVIDENCE_POLICY_MIN_REFS)}), is_create) AS p_min,
        countIf(is_create AND {_attr(sc.EVIDENCE_POLICY_REQUIRE_CLAIMS)} = 'true') > 0
            AS p_claims,
        countIf(is_create AND mapContains(attributes, '{must}')) > 0 AS has_must,
        maxIf({_attr(must)}, is_create AND mapContains(attributes, '{must}')) AS must_text,
        minIf(rkey, rkey > 0) AS first_key,
        groupArrayIf({per_row}, rkey > 0) AS results,
        groupUniqArrayArrayIf({_strings(sc.RESULT_FIELDS)}, rkey > 0) AS fields
    FROM (
        SELECT tenant, handoff_id, attributes, evidence_refs,
            {_IS_CREATE} AS is_create,
            {_result_key()} AS rkey,
            {_strings(sc.EVIDENCE_VALID_AT)} AS valid_at,
            {_strings(sc.EVIDENCE_CLAIMS)} AS claims
        FROM {db}.handoff_transitions
        PREWHERE event IN ('create', {_RESULT_LIST})
        WHERE (tenant, handoff_id) IN ({_declaring(db, since, tenant_and, within)})
    )
    GROUP BY tenant, handoff_id
)"""


def failed_sql(db: str, since: str, tenant_and: str = "", within: str | None = None) -> str:
    """SQL of (tenant, handoff_id) of the handoffs of checks_sql whose result fails a check:
    what the cohort's V(h) leaves out (of the handoffs of `within` when given)."""
    return f"""SELECT tenant, handoff_id FROM ({checks_sql(db, since, tenant_and, within)})
WHERE out_of_window OR below_policy OR contract_unmet"""
