"""The `evidence` anomaly pass (analytics/_sql/anomalies.py): a result's evidence and fields
checked against the evidence policy and reply contract its envelope declares, instead of
taken on the emitter's word.

  evidence_out_of_window   the first result transition has a ref whose valid_at is outside
                           the policy's window [valid_after, valid_before) (or has none)
  evidence_below_policy    ... fewer distinct refs than min_refs, or a ref without a claim
                           where the policy requires claims
  reply_contract_unmet     committed (or verified), and a field of must_return is in no
                           result row's result.fields
  evidence_claim_disputed  the emitter marked that first result's evidence valid (count >= 1,
                           valid = true) while one of the checks above fails: the results
                           V(h) no longer counts as evidenced

One GROUP BY per handoff over only the handoffs that declare a check (their create rows by
PREWHERE on `audit_attrs`, sql/017; then their create and result rows by primary key:
analytics/_sql/evidence_facts.py), joined to the cohort's summary rows of those handoffs
only, for E, the emitter's claim and whether it committed. A store where no handoff
declares a check reads the window's `audit_attrs` column and nothing else.
Definitions: docs/metrics.md; the reference: analytics/oracle/evidence.py.
"""

from __future__ import annotations

from typing import Final

from analytics._sql import contract as cs
from analytics._sql.cohort import Window, cohort_sql, ts
from analytics._sql.evidence_facts import checks_sql

__all__ = ["PASSES", "evidence_pass"]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {
    "evidence": (
        "evidence_out_of_window",
        "evidence_below_policy",
        "reply_contract_unmet",
        "evidence_claim_disputed",
    ),
}


def evidence_pass(
    db: str, window: Window, tenant: bool, keys: str | None = None, *, failed: bool = False
) -> str:
    """The four kinds (module doc), one row per flagged cohort handoff; no query of the
    store when the window knows no handoff since its start declares a check. `keys` (SQL
    of (tenant, handoff_id) rows): only those handoffs are judged and read. The column
    `evidence_failed` (a check fails: V(h) leaves the handoff out, whether or not a kind is
    set) comes too; with `failed`, so do the rows where only it is set."""
    absent = window.checks_absent_since
    if absent is not None and absent <= window.start:
        kinds = ", ".join(f"false AS {k}" for k in PASSES["evidence"])
        none = ", false AS evidence_failed" if failed else ""
        return f"SELECT '' AS tenant, '' AS handoff_id, {kinds}{none} WHERE false"
    tenant_and = "AND tenant = {tenant:String}" if tenant else ""
    cohort = cohort_sql(
        db, window, tenant_param=tenant, within="SELECT tenant, handoff_id FROM checked"
    )
    committed = cs.has("tmask", cs.COMMITTED_MASK)
    fails = "out_of_window OR below_policy OR contract_unmet"
    return f"""WITH checked AS ({checks_sql(db, ts(window.start), tenant_and, keys)})
SELECT tenant, handoff_id,
    out_of_window AS evidence_out_of_window,
    below_policy AS evidence_below_policy,
    contract_unmet AND {committed} AS reply_contract_unmet,
    is_v_claimed AND ({fails}) AS evidence_claim_disputed,
    {fails} AS evidence_failed
FROM (SELECT tenant, handoff_id, tmask, is_v_claimed FROM ({cohort})) AS c
INNER JOIN checked USING (tenant, handoff_id)
WHERE evidence_out_of_window OR evidence_below_policy OR reply_contract_unmet
   OR evidence_claim_disputed{" OR evidence_failed" if failed else ""}"""
