"""Anomalies of the cohort (docs/design.md list), each a count of handoffs plus example ids.

Kinds are computed in passes (analytics/_sql/anomalies.py): one query per pass, several kinds
per pass; `count` is the number of distinct handoffs flagged (for rejection_spike: the rejected handoffs of the spiking
(to_agent, capability) groups; for sustained_rejections: those of the runs' hours). Exact definitions and thresholds: docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from analytics._sql.anomalies import (
    COHORT_PASSES,
    HEAVY_PASSES,
    KIND_PASS,
    PASSES,
    REPEATING_PASSES,
    SPIKE_BASELINE_FACTOR,
    SPIKE_MIN_RATE,
    SPIKE_MIN_SETTLED,
    created_in_sql,
    pass_sql,
)
from analytics._sql.cohort import Window, check_db, settled_window
from analytics._sql.tasks import backfill_sql
from analytics.oracle.funnel import UNKNOWN_SLA_MS
from foundation.store import query_each

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "ANOMALY_KINDS",
    "DESCRIPTIONS",
    "SPIKE_BASELINE_FACTOR",
    "SPIKE_MIN_RATE",
    "SPIKE_MIN_SETTLED",
    "anomalies",
    "anomaly_handoff_ids",
    "anomaly_sql",
    "backfill_task_index",
]

DESCRIPTIONS: Final = {
    "invalid_transition": "a transition not in the state table, flagged valid=false, a second "
    "move out of the same state, or any message after a terminal state",
    "duplicate_delivery": "the same transition (event, from, to) stored as two different "
    "spans, or under one span id at two times (a span stored again unchanged is one span)",
    "idempotency_conflict": "the same idempotency key created with a different payload_hash",
    "stale_fence": "a commit whose fence token (or state version) is lower than one seen "
    "earlier for the same task",
    "committed_without_evidence": "reached committed/verified, but its first result carried no "
    "valid evidence (count >= 1 and valid = true, and the envelope's evidence checks pass)",
    "unknown_unresolved": "entered unknown and not resolved within the SLA (default 15 min)",
    "accepted_never_started": "still in accepted (never running, no unknown, no terminal state) "
    "past its deadline",
    "bounce": "a transfer handed straight back (A->B transfer, then B->A transfer in the task)",
    "rejection_spike": "rejection rate of one to_agent+capability in an hour far above its "
    "baseline (the 24 hours before)",
    "sustained_rejections": "rejected in a run of hours (at least 2) in which one "
    "to_agent+capability rejected at least half of at least 5 settled handoffs each hour: an "
    "outage, however long (HANDOFFS_SUSTAINED_REJECTION_RATE, _MIN_SETTLED, _HOURS)",
    "clock_skew": "a transition timestamped before the transition it must follow",
    "orphan_transition": "transitions (first seen in the window) of a handoff whose create was "
    "never seen",
    "implied_accept": "accepted or later reached without an accept transition",
    "blind_retry": "an attempt created while an earlier attempt it retries (retry_of, the "
    "same task, to_agent and idempotency key, or inferred: no retry_of and the same task, "
    "agents and objective hash) was unknown: entered before, left after or never",
    "retry_after_final_refusal": "a new attempt (retry_of, or inferred: no retry_of and the "
    "same task, agents and objective hash) created after the attempt it retries was rejected "
    "with a code marked final (permission_denied, unknown_capability, ...): the refusal "
    "will not change",
    "duplicate_execution": "reached committed after another attempt with the same idempotency "
    "key had already committed: the side effect done twice",
    "consumed_before_verified": "created with a causation_id naming a handoff not yet verified",
    "expired_receipt_used": "created with a causation_id naming a handoff after its receipt "
    "expired",
    "wrong_consumer": "a receiver event (accept, reject, start, prepare, commit, fail) whose "
    "actor is not the envelope's to_agent",
    "grant_expired": "a start, prepare or commit after the grant's expires_at",
    "capability_outside_grant": "envelope capabilities not all in grant.capabilities",
    "grant_tenant_mismatch": "grant.tenant differs from the credential's (stored) tenant",
    "tenant_claim_mismatch": "a span whose claimed tenant differs from the credential's",
    "grant_caller_mismatch": "a grant whose caller is set and is not the envelope's from_agent",
    "missing_grant": "asks for capabilities without any grant, where the policy requires one "
    "(HANDOFFS_REQUIRE_GRANTS=1; default off)",
    "out_of_order_version": "a transition carrying a state_version lower than one an earlier "
    "transition of the same task carried (any event, not only a commit)",
    "keyless_duplicate_write": "a committed command or shared-queue write without an "
    "idempotency key, with the payload hash of another such write to the same agent created "
    "at most 600 s before it (HANDOFFS_KEYLESS_WINDOW_S): the side effect done twice",
    "consumer_lag": "a queue consumer that accepted the message more than 60 s after it was "
    "enqueued (queue.lag_ms) or more than 1,000 offsets behind the queue's head (settings "
    "HANDOFFS_CONSUMER_LAG_MS, HANDOFFS_CONSUMER_LAG_OFFSETS)",
    "consumer_stalled": "a shared-queue message its consumer neither took nor refused (nor its "
    "sender withdrew) for more than 300 s (HANDOFFS_CONSUMER_STALL_S) while the queue's head "
    "moved past its offset",
    "partial_result_committed": "committed, with a result that returned fewer items than "
    "expected while its evidence was marked valid",
    "unfiltered_sensitive_history": "a transfer whose handed-over history kept sensitive items "
    "(history.sensitive_items > history.removed_items)",
    "stale_agent_card": "rejected as not doing or speaking what the Agent Card said, with a "
    "card fetched more than 24 h before (HANDOFFS_AGENT_CARD_MAX_AGE_S), or asking for a "
    "capability the card's skills lack",
    "card_skill_refused": "rejected as not doing the skill (unknown_capability) although the "
    "Agent Card the sender used was fresh (HANDOFFS_AGENT_CARD_MAX_AGE_S) and lists every "
    "capability asked: the card is wrong, not stale",
    "command_replayed": "a command executed again during a replay (a replay=true transition "
    "into running or beyond)",
    "incompatible_accepted": "accepted by a consumer whose supported_versions lack the "
    "envelope's schema_version",
    "risky_field_ignored": "accepted while ignoring an unknown envelope field on the risk list "
    "(HANDOFFS_RISKY_FIELDS: grant.*, tenant, amount*, permission*, resource_version)",
    "fan_out_all": "an agent-as-tool task whose orchestrator called at least 3 distinct "
    "experts, every expert it called in the window",
    "evidence_out_of_window": "a result citing evidence whose valid_at is outside the evidence "
    "policy's window (valid_after inclusive, valid_before exclusive) or not given",
    "evidence_below_policy": "a result with fewer evidence refs than the policy's min_refs, or "
    "a ref without a claim where the policy requires claims",
    "reply_contract_unmet": "committed, while its results' result.fields lack a field the reply "
    "contract's must_return names",
    "evidence_claim_disputed": "the emitter marked the result's evidence valid, but an evidence "
    "policy or reply contract check failed: not counted as evidenced",
    "deadline_overrun": "committed, failed or rejected after the envelope's deadline_ms had "
    "passed since created (the first terminal state, in machine order; no deadline_ms, no "
    "promise)",
    "tool_budget_exceeded": "a result recorded more tool calls (handoff.tool_calls) than the "
    "envelope's max_tool_calls",
    "ack_missing": "the message required an acknowledgement, and no accept or reject came "
    "within its ttl_s (late, or still none at the window's clock)",
}
ANOMALY_KINDS: Final = tuple(DESCRIPTIONS)


def _params(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant is not None else {}


def _kind_sql(kind: str, db: str, window: Window, tenant: bool, sla_ms: int) -> str:
    if kind not in KIND_PASS:
        raise ValueError(f"unknown anomaly kind {kind!r}; choose from {', '.join(ANOMALY_KINDS)}")
    inner = pass_sql(KIND_PASS[kind], db, window, tenant=tenant, sla_ms=sla_ms)
    return f"SELECT handoff_id FROM ({inner}) WHERE {kind}"


def anomaly_sql(
    kind: str, db: str, window: Window, *, tenant: bool, unknown_sla_ms: int = UNKNOWN_SLA_MS
) -> str:
    """SQL of the handoff ids `kind` flags in the window's cohort (one row per flag, ids may
    repeat; `{tenant:String}` a parameter when `tenant`). ValueError for an unknown kind."""
    return _kind_sql(kind, check_db(db), window, tenant, unknown_sla_ms)


def anomaly_handoff_ids(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    kind: str,
    tenant: str | None = None,
    limit: int = 1000,
    unknown_sla_ms: int = UNKNOWN_SLA_MS,
) -> list[str]:
    """Handoff ids flagged with `kind` in the window's cohort (sorted, at most `limit`).
    ValueError for an unknown kind."""
    db = check_db(database)
    inner = _kind_sql(kind, db, window, tenant is not None, unknown_sla_ms)
    sql = f"SELECT DISTINCT handoff_id FROM ({inner}) ORDER BY handoff_id LIMIT {int(limit)}"
    return [r[0] for r in client.query(sql, parameters=_params(tenant)).result_rows]


def anomalies(
    client: Client,
    *,
    database: str | None = None,
    window: Window,
    tenant: str | None = None,
    examples: int = 5,
    unknown_sla_ms: int = UNKNOWN_SLA_MS,
    kinds: Iterable[str] | None = None,
) -> pd.DataFrame:
    """One row per kind in ANOMALY_KINDS, or of `kinds` in that order (zero counts
    included): kind, count (distinct handoffs: tenant and id), examples (up to `examples`
    handoff ids, sorted), description. ValueError for an unknown kind.

    One query per pass needed (a pass computes several kinds: _sql.anomalies.PASSES), two at
    a time when the client has a sibling (foundation.store.query_each), after one that
    stops at the first handoff created in the window: without one, only the orphan pass runs (the other kinds flag
    cohort handoffs only). Timings: docs/metrics.md, bench/analytics_queries.py.
    """
    db = check_db(database)
    if examples < 0:
        raise ValueError(f"examples must be >= 0, got {examples}")
    wanted = ANOMALY_KINDS if kinds is None else tuple(kinds)
    for k in wanted:
        if k not in KIND_PASS:
            raise ValueError(f"unknown anomaly kind {k!r}; choose from {', '.join(ANOMALY_KINDS)}")
    # the sorted example list keeps the 2n smallest ids, so n distinct survive duplicates
    # (one id flagged under two tenants)
    keep = max(1, 2 * int(examples))
    window = settled_window(client, db, window, tenant)
    found: dict[str, tuple[int, list[str]]] = {}
    passes = {n: ks for n, ks in PASSES.items() if set(ks) & set(wanted)}
    if (
        set(passes) & COHORT_PASSES
        and not client.query(
            created_in_sql(db, window, tenant=tenant is not None), parameters=_params(tenant)
        ).result_rows
    ):
        for name in COHORT_PASSES & set(passes):
            found.update((k, (0, [])) for k in passes.pop(name))

    def job(name: str) -> Callable[[Client], None]:
        pass_kinds = passes[name]
        inner = pass_sql(name, db, window, tenant=tenant is not None, sla_ms=unknown_sla_ms)
        # a handoff is its tenant and id; a pass returning each at most once is counted by
        # rows (a distinct count of millions of ids costs more than the pass itself)
        count = (
            "uniqExactIf((tenant, handoff_id), {k})" if name in REPEATING_PASSES else "countIf({k})"
        )
        cols = ", ".join(
            f"{count.format(k=k)}, groupArraySortedIf({keep})(handoff_id, {k})" for k in pass_kinds
        )
        sql = f"SELECT {cols} FROM ({inner})"

        def run(c: Client) -> None:
            vals = c.query(sql, parameters=_params(tenant)).result_rows[0]
            for i, k in enumerate(pass_kinds):
                ex = list(dict.fromkeys(vals[2 * i + 1]))[:examples]
                found[k] = (int(vals[2 * i]), ex)

        return run

    # the dearest passes first: two run at once (foundation.store.query_each)
    order = [n for n in HEAVY_PASSES if n in passes] + [n for n in passes if n not in HEAVY_PASSES]
    query_each(client, [job(n) for n in order])
    rows = [
        {"kind": k, "count": found[k][0], "examples": found[k][1], "description": DESCRIPTIONS[k]}
        for k in ANOMALY_KINDS
        if k in wanted
    ]
    return pd.DataFrame(rows, columns=["kind", "count", "examples", "description"])


def backfill_task_index(client: Client, *, database: str | None = None) -> int:
    """Fill handoff_tasks (sql/005) from the stored transitions, for a store created before
    005 (a new store needs nothing: the view fills it). Safe while ingest runs and when run
    again (readers dedup). Returns the distinct (tenant, task_id, handoff_id) rows indexed."""
    db = check_db(database)
    client.command(backfill_sql(db))
    return int(
        client.query(
            f"SELECT count() FROM (SELECT DISTINCT tenant, task_id, handoff_id FROM {db}.handoff_tasks)"
        ).result_rows[0][0]
    )
