"""SQL of the anomaly kinds, grouped into passes: one query (one scan) per pass.

Each pass returns one row per flagged-or-candidate handoff: `tenant`, `handoff_id` plus one
Bool column per kind it computes (named after the kind); every pass but those in
REPEATING_PASSES returns at most one row per (tenant, handoff_id). anomalies() aggregates a
pass once for all its kinds; anomaly_handoff_ids() selects one kind's column.

Why passes (bench/analytics_queries.py, 10M transitions / 2.67M handoffs): a query per kind
re-reads the cohort (handoff_summary FINAL) every time, and some kinds would re-read all
transitions twice (clock skew self-join) or window-sort every task (stale fence); 24 h took
~37 s that way. The passes:
  cohort       five kinds that are bit tests over the cohort's summary rows
  state*       duplicate delivery, clock skew, receiver actor, grant, tenant claim: the
               settled flags plus the handoffs touched since (settled.py)
  fence*       stale fence over the fenced rows of the cohort's fenced commits' tasks
  idempotency* a create row's key created elsewhere with another payload hash
  retry*       blind retry, duplicate execution (the attempts from handoff_summary)
  causation*   consumed before verified, expired receipt
  bounce       over the summary's `transfer` create rows only (state_passes.py)
  spike        per-bucket rejection rates against a trailing baseline (spikes.py)
  orphan       candidates from a cheap filter, checked exactly by key
  topology     each topology's own kinds from one scan of the cohort's create, accept,
               reject and executing rows (topology.py)
  fan_out      agent-as-tool fan-out over the cohort's summary rows (topology.py)
  evidence     results checked against the envelope's evidence policy and reply
               contract, over the handoffs declaring one (evidence_checks.py)
  sustained    runs of hours whose rejection rate stays high (sustained.py)
  stall        shared-queue messages never taken while the queue went on (stall.py)
  deadline     an outcome reached after the envelope's deadline: the cohort's candidates,
               then their state rows by key (budget.py)
  budget       tool calls over the envelope's budget, acks missing or late: the rows that
               carry them (audit_attrs), then those handoffs' rows by key (budget.py)
  refusal, keyless, grant_checks, version_order
               what senders do but do not declare: a retry after a final refusal, a keyless
               write done twice, the grant's caller and presence, versions out of order
               (inferred.py)
* read handoff_anomaly_state (sql/009, state_passes.py: one row per handoff kept
  at insert), never handoff_transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

from analytics._sql import budget, inferred, stall, sustained
from analytics._sql import contract as cs
from analytics._sql import evidence_checks as evidence
from analytics._sql import topology as topo
from analytics._sql.anomaly_state import COPY_KEY  # noqa: F401 (re-exported)
from analytics._sql.cohort import Window, cohort_sql, ts
from analytics._sql.settled import settled_state_pass
from analytics._sql.settled_audits import AUDIT_PASSES, settled_audit_pass
from analytics._sql.settled_relations import RELATION_PASSES, settled_relation_pass
from analytics._sql.spikes import (  # noqa: F401 (re-exported: the spike thresholds)
    SPIKE_BASELINE_FACTOR,
    SPIKE_MIN_RATE,
    SPIKE_MIN_SETTLED,
    spike_pass,
)
from analytics._sql.state_passes import STATE_PASSES

#: pass name -> the kinds (Bool columns) it returns (reports list kinds in ANOMALY_KINDS order).
PASSES: Final = {
    "cohort": (
        "invalid_transition",
        "committed_without_evidence",
        "unknown_unresolved",
        "accepted_never_started",
        "implied_accept",
    ),
    "state": (
        "duplicate_delivery",
        "clock_skew",
        "wrong_consumer",
        "grant_expired",
        "capability_outside_grant",
        "grant_tenant_mismatch",
        "tenant_claim_mismatch",
    ),
    "idempotency": ("idempotency_conflict",),
    "fence": ("stale_fence",),
    "bounce": ("bounce",),
    "spike": ("rejection_spike",),
    "orphan": ("orphan_transition",),
    "retry": ("blind_retry", "duplicate_execution"),
    "causation": ("consumed_before_verified", "expired_receipt_used"),
    **topo.PASSES,
    **evidence.PASSES,
    **sustained.PASSES,
    **stall.PASSES,
    **budget.PASSES,
    **inferred.PASSES,
}
KIND_PASS: Final = {k: p for p, kinds in PASSES.items() for k in kinds}
#: the passes that may return a handoff in several rows (retry: one row per pair of attempts)
REPEATING_PASSES: Final = frozenset({"retry"})
#: the passes that flag only cohort handoffs (created in the window): when no handoff was
#: created in it, their kinds are all 0 without a query (orphans have no create at all)
COHORT_PASSES: Final = frozenset(PASSES) - {"orphan"}
#: the passes that cost the most over any window (the most fixed cost, and they read the
#: window's rows: bench/analytics_queries.py prints each pass's cost, also over an empty
#: window), run first when passes run two at a time, so that the cheap ones fill the other
#: connection meanwhile
HEAVY_PASSES: Final = ("spike", "sustained", "topology", "fan_out")


def created_in_sql(db: str, window: Window, *, tenant: bool) -> str:
    """SQL of one row (1) when some summary row has `created` in the window, none else. A
    handoff's cohort `created` is the least of its rows' (only create rows carry one), so
    without such a row the cohort is empty; the read stops at the first match."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    return f"""SELECT 1 FROM {db}.handoff_summary
WHERE created IS NOT NULL AND created >= {ts(window.start)} AND created < {ts(window.end)} {tw}
LIMIT 1"""


def _ids(cohort: str) -> str:
    return f"(tenant, handoff_id) IN (SELECT tenant, handoff_id FROM ({cohort}))"


def _cohort_pass(db: str, window: Window, tenant: bool, sla_ms: int) -> str:
    now_ns = f"toUnixTimestamp64Nano({ts(window.clock())})"
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("uncounted", "t_unknown_in"))
    return f"""SELECT tenant, handoff_id,
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


def _orphan_pass(db: str, window: Window, tenant: bool) -> str:
    """A handoff whose rows all lack `created` and whose earliest row is in the window: the
    row holding that minimum is itself a created-less row first seen in the window, so such
    rows are the candidates; the exact test then reads only their keys."""
    tw = "AND tenant = {tenant:String}" if tenant else ""
    lo, hi = ts(window.start), ts(window.end)
    return f"""SELECT tenant, handoff_id, true AS orphan_transition FROM {db}.handoff_summary
WHERE (tenant, handoff_id) IN (
    SELECT tenant, handoff_id FROM {db}.handoff_summary
    WHERE created IS NULL AND first_seen >= {lo} AND first_seen < {hi} {tw})
GROUP BY tenant, handoff_id
HAVING min(created) IS NULL AND min(first_seen) >= {lo} AND min(first_seen) < {hi}"""


def pass_sql(name: str, db: str, window: Window, *, tenant: bool, sla_ms: int) -> str:
    """SQL of one pass (see module doc); ValueError for an unknown pass."""
    if name == "cohort":
        return _cohort_pass(db, window, tenant, sla_ms)
    builders: dict[str, Callable[[str, Window, bool], str]] = {
        **STATE_PASSES,
        "state": settled_state_pass,
        **{n: partial(settled_relation_pass, n) for n in RELATION_PASSES},
        "spike": spike_pass,
        "orphan": _orphan_pass,
        "topology": topo.topology_pass,
        "fan_out": topo.fan_out_pass,
        "sustained": sustained.sustained_pass,
        "stall": stall.stall_pass,
        "version_order": inferred.versions_pass,
        **{n: partial(settled_audit_pass, n) for n in AUDIT_PASSES},
    }
    if name not in builders:
        raise ValueError(f"unknown anomaly pass {name!r}")
    return builders[name](db, window, tenant)
