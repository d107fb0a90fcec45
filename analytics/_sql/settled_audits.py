"""The audit kinds from settled flags (sql/018) plus the live remainder, and their part of the
settle job (analytics._sql.settled).

The contract checks the audit passes make read attribute maps: the evidence policy and reply
contract, the tool budget and ack, the grant's caller, the objective hash. Over a week of a
busy store the handoffs declaring one are spread over every granule of handoff_transitions,
so a query reading them reads the whole map column. But each kind is a function of one
handoff's own rows, or of a few related handoffs' (a retry after a final refusal: the
refused attempts of its task and the one its retry_of names; a keyless write: the writes
sharing its target and payload hash), and none depends on the window: so the settle job
computes them once the rows came in, as it does the relation flags, and a query reads bits.

  settle  the handoffs touched in [watermark, until) and the handoffs related to one of
          them (related_sql) get their bits recomputed by the passes' own SQL with those
          handoffs as the only subjects (over all time, the clock at `until`), written to
          handoff_audit_flags (a row when a bit is set or a keyless gap exists; the row of
          an earlier settle replaced by a 0 first).
  pass    the bits of the cohort but the handoffs related to a live one, plus those
          recomputed by the pass; with no watermark matching the cohort copy's, the whole
          pass recomputed.

What a query's settings change is kept as a fact, not a verdict: the ns since the keyless
write before (the kind for any HANDOFFS_KEYLESS_WINDOW_S), whether capabilities were asked
with no grant (missing_grant under HANDOFFS_REQUIRE_GRANTS). What the clock changes is kept
as `ack_open` (an ack asked for and none stored at the settle; ack_missing is kept only for
an ack that came late): those handoffs are recomputed by every query with its clock, as the
live ones are. `evidence_failed` (AUDIT_FAILED_BIT) is
the cohort's: V(h) leaves those handoffs out (analytics._sql.cohort.cohort_sql).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from analytics._sql import budget, inferred
from analytics._sql import evidence_checks as evidence
from analytics._sql.anomaly_state import TABLE as STATE_TABLE
from analytics._sql.cohort import Window, ts
from analytics._sql.inferred_policy import Policy, policy
from analytics._sql.watermarks import AUDIT_FAILED_BIT, AUDIT_FLAGS_TABLE, Settled, live_keys_sql

__all__ = [
    "AUDIT_BITS",
    "AUDIT_PASSES",
    "audit_settle_sql",
    "related_sql",
    "settled_audit_pass",
]

#: kind or fact -> its bit in handoff_audit_flags.flags
AUDIT_BITS: Final = {
    "evidence_out_of_window": 0,
    "evidence_below_policy": 1,
    "reply_contract_unmet": 2,
    "evidence_claim_disputed": 3,
    "evidence_failed": AUDIT_FAILED_BIT,
    "deadline_overrun": 5,
    "tool_budget_exceeded": 6,
    "ack_missing": 7,
    "ack_open": 8,
    "grant_caller_mismatch": 9,
    "grant_absent": 10,
    "retry_after_final_refusal": 11,
}
#: the relations a handoff's audit kinds depend on besides its own rows (related_sql)
TASK, RETRY_OF, KEYLESS = "task", "retry_of", "keyless"
#: the settle's window: every handoff whatever its created time (the clock is `until`)
_ALL_TIME: Final = (datetime(1970, 1, 2, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))

Builder = Callable[[str, Window, str], str]
SettleBuilder = Callable[[str, Window, str, Policy], str]


@dataclass(frozen=True, slots=True)
class AuditPass:
    """One settled pass: its kinds, the relations its kinds follow, the SQL of the whole
    pass over a window (no settled flags to read), of its kinds for the subjects of `keys`
    in a window (a query's live remainder), and the SQL the settle runs (the same pass,
    with the facts it keeps besides the kinds, each a bit)."""

    kinds: tuple[str, ...]
    relations: tuple[str, ...]
    full: Callable[[str, Window, bool], str]
    query: Builder
    settle: SettleBuilder
    facts: tuple[str, ...] = ()


def _grants_settle(db: str, window: Window, keys: str, pol: Policy) -> str:
    # missing_grant kept as the fact grant_absent, only when the settle's policy requires
    # grants (a query requiring them reads it only from such a settle)
    return f"""SELECT tenant, handoff_id, grant_caller_mismatch, missing_grant AS grant_absent
FROM ({inferred.grants_pass(db, window, False, pol, keys)})"""


AUDIT_PASSES: Final = {
    "evidence": AuditPass(
        evidence.PASSES["evidence"],
        (),
        evidence.evidence_pass,
        lambda db, w, k: evidence.evidence_pass(db, w, False, k),
        lambda db, w, k, _p: evidence.evidence_pass(db, w, False, k, failed=True),
        ("evidence_failed",),
    ),
    "deadline": AuditPass(
        budget.PASSES["deadline"],
        (),
        budget.deadline_pass,
        lambda db, w, k: budget.deadline_pass(db, w, False, k),
        lambda db, w, k, _p: budget.deadline_pass(db, w, False, k),
    ),
    "budget": AuditPass(
        budget.PASSES["budget"],
        (),
        budget.budget_pass,
        lambda db, w, k: budget.budget_pass(db, w, False, k),
        lambda db, w, k, _p: budget.budget_pass(db, w, False, k, pending=True),
        ("ack_open",),
    ),
    "grant_checks": AuditPass(
        inferred.PASSES["grant_checks"],
        (),
        inferred.grants_pass,
        lambda db, w, k: inferred.grants_pass(db, w, False, None, k),
        _grants_settle,
        ("grant_absent",),
    ),
    "refusal": AuditPass(
        inferred.PASSES["refusal"],
        (TASK, RETRY_OF),
        inferred.refusal_pass,
        lambda db, w, k: inferred.refusal_pass(db, w, False, k),
        lambda db, w, k, _p: inferred.refusal_pass(db, w, False, k),
    ),
    "keyless": AuditPass(
        inferred.PASSES["keyless"],
        (KEYLESS,),
        inferred.keyless_pass,
        lambda db, w, k: inferred.keyless_pass(db, w, False, None, k),
        lambda db, w, k, p: inferred.keyless_pass(db, w, False, p, k, gaps=True),
    ),
}


def related_sql(db: str, keys: str, relations: tuple[str, ...], keyless_window_s: int = 0) -> str:
    """(tenant, handoff_id) of the handoffs of `keys` (SQL of such rows) and of those whose
    audit kinds their rows can change through `relations`: the handoffs of their tasks
    (handoff_tasks by primary key), those whose retry_of names one of them (the state's
    column), and the keyless writes sharing a create's (tenant, to_agent, payload hash)
    created at most `keyless_window_s` from it (typed columns: a later write's gap to the
    write before it changes; a gap over the window stays over it, so it is not read)."""
    parts = [f"SELECT tenant, handoff_id FROM ({keys})"]
    if TASK in relations:
        parts.append(f"""SELECT tenant, handoff_id FROM {db}.handoff_tasks WHERE (tenant, task_id) IN (
    SELECT tenant, task_id FROM {db}.handoff_summary
    WHERE task_id != '' AND (tenant, handoff_id) IN ({keys}))""")
    if RETRY_OF in relations:
        parts.append(f"""SELECT tenant, handoff_id FROM {db}.{STATE_TABLE}
WHERE retry_of != '' AND (tenant, retry_of) IN ({keys})""")
    if KEYLESS in relations:
        w_ns = int(keyless_window_s) * 1_000_000_000
        mine = f"""SELECT tenant, to_agent, payload_hash, toUnixTimestamp64Nano(time) AS t
    FROM {db}.handoff_transitions
    PREWHERE event = 'create' AND payload_hash != ''
    WHERE (tenant, handoff_id) IN ({keys})"""
        parts.append(f"""SELECT w.tenant, w.handoff_id FROM (
    SELECT tenant, handoff_id, to_agent, payload_hash, toUnixTimestamp64Nano(time) AS t
    FROM {db}.handoff_transitions
    PREWHERE event = 'create' AND payload_hash != '' AND idempotency_key = ''
    WHERE toUnixTimestamp64Nano(time) BETWEEN (SELECT min(t) FROM ({mine})) - {w_ns}
        AND (SELECT max(t) FROM ({mine})) + {w_ns}
) AS w
INNER JOIN ({mine}) AS x
    ON w.tenant = x.tenant AND w.to_agent = x.to_agent AND w.payload_hash = x.payload_hash
WHERE abs(w.t - x.t) <= {w_ns}""")
    return "\nUNION ALL\n".join(parts)


def _once(
    db: str, keys: str, relations: tuple[str, ...], name: str, keyless_window_s: int
) -> tuple[str, str]:
    """A WITH clause computing related_sql once per query as the constant array `name`,
    and SQL of its (tenant, handoff_id) rows (a subquery named in several places would be
    evaluated in each)."""
    related = related_sql(db, keys, relations, keyless_window_s)
    with_ = f"WITH (SELECT groupUniqArray((tenant, handoff_id)) FROM ({related})) AS {name}"
    return with_, f"SELECT k.1 AS tenant, k.2 AS handoff_id FROM (SELECT arrayJoin({name}) AS k)"


def _bits(columns: tuple[str, ...]) -> str:
    return " + ".join(f"toUInt32({c}) * {1 << AUDIT_BITS[c]}" for c in columns)


def _pass_bits(p: AuditPass) -> tuple[str, ...]:
    return tuple(k for k in p.kinds if k in AUDIT_BITS) + p.facts


def _mask(passes: Iterable[AuditPass]) -> int:
    return sum(1 << AUDIT_BITS[c] for p in passes for c in _pass_bits(p))


def audit_settle_sql(
    db: str, keys: str, until_ms: int, replaces: bool = True, *, pol: Policy
) -> str:
    """INSERT of the audit flags of the handoffs of `keys` (SQL of the touched handoffs'
    (tenant, handoff_id); its query parameters bound by the caller) and of those related
    to them: a row per handoff with a bit or a keyless gap (version 2 x until + 1), and
    unless `replaces` is False (the table holds no row yet) a 0 (version 2 x until) over
    each one's row of an earlier settle (as analytics._sql.settled_relations).

    Each pass recomputes only the handoffs its kinds can have changed for: a pass without
    relations the touched ones, the refusal pass those and their related through tasks
    and retry_of, the keyless pass those and the writes within the policy's keyless window
    of them (its gaps up to that window are exact). missing_grant is kept only when the
    policy requires grants. The watermark records both. A handoff a pass did
    not recompute keeps that pass's bits (or gap) from its row of the earlier settle.
    Every set is read once into a constant."""
    by_rel: dict[tuple[str, ...], list[AuditPass]] = {}
    for p in AUDIT_PASSES.values():
        by_rel.setdefault(p.relations, []).append(p)
    names = {rel: f"audit_s{i}" for i, rel in enumerate(sorted(by_rel))}
    withs, rows = [], {}
    for rel, name in names.items():
        w, r = _once(db, keys, rel, name, pol.keyless_window_s)
        withs.append(w.removeprefix("WITH "))
        rows[rel] = r
    union = " UNION ALL ".join(rows.values())
    clock = datetime.fromtimestamp(until_ms / 1000, tz=UTC)
    # read against "nothing settled": the cohort's rows come from handoff_summary by key
    window = Window(start=_ALL_TIME[0], end=_ALL_TIME[1], as_of=clock, settled=Settled(0, 0))
    no_gap = "CAST(NULL, 'Nullable(Int64)')"
    parts = []
    for rel, passes in by_rel.items():
        for p in passes:
            sql = p.settle(db, window, rows[rel], pol)
            if p.kinds == inferred.PASSES["keyless"]:
                parts.append(
                    f"SELECT tenant, handoff_id, toUInt32(0) AS bits, keyless_gap_ns AS gap FROM ({sql})"
                )
            else:
                parts.append(
                    f"SELECT tenant, handoff_id, {_bits(_pass_bits(p))} AS bits, {no_gap} AS gap FROM ({sql})"
                )
        # what these passes did not recompute keeps its bits (or gap) from the earlier row
        keep_gap = "o.4" if any(p.kinds == inferred.PASSES["keyless"] for p in passes) else no_gap
        parts.append(f"""SELECT o.1 AS tenant, o.2 AS handoff_id, bitAnd(o.3, {_mask(passes)}) AS bits,
        {keep_gap} AS gap
    FROM (SELECT arrayJoin(audit_old) AS o)
    WHERE (o.1, o.2) NOT IN ({rows[rel]})""")
    fresh = "\n    UNION ALL\n    ".join(parts)
    created = f"""SELECT tenant, handoff_id, min(created) AS c FROM {db}.handoff_summary
        WHERE (tenant, handoff_id) IN ({union})
        GROUP BY tenant, handoff_id HAVING c IS NOT NULL"""
    # a created time only moves earlier: an earlier row is at or after the least now
    old = f"""SELECT tenant, handoff_id, flags, keyless_gap_ns, created
        FROM {db}.{AUDIT_FLAGS_TABLE} FINAL
        WHERE {"(flags != 0 OR keyless_gap_ns IS NOT NULL)" if replaces else "0"}
          AND created >= arrayMin(arrayMap(x -> x.3, audit_created))
          AND (tenant, handoff_id) IN ({union})"""
    return f"""INSERT INTO {db}.{AUDIT_FLAGS_TABLE} (tenant, handoff_id, created, flags, keyless_gap_ns, version)
WITH {", ".join(withs)},
    (SELECT groupArray((tenant, handoff_id, assumeNotNull(c))) FROM ({created})) AS audit_created,
    (SELECT groupArray((tenant, handoff_id, flags, keyless_gap_ns, created)) FROM ({old})) AS audit_old
SELECT f.tenant, f.handoff_id, s.created, f.flags, f.gap, toUInt64({2 * until_ms + 1})
FROM (
    SELECT tenant, handoff_id, groupBitOr(bits) AS flags, min(gap) AS gap FROM (
    {fresh}
    ) GROUP BY tenant, handoff_id HAVING flags != 0 OR gap IS NOT NULL
) AS f
INNER JOIN (
    SELECT c.1 AS tenant, c.2 AS handoff_id, c.3 AS created FROM (SELECT arrayJoin(audit_created) AS c)
) AS s ON s.tenant = f.tenant AND s.handoff_id = f.handoff_id
UNION ALL
SELECT o.1, o.2, o.5, 0, {no_gap}, toUInt64({2 * until_ms})
FROM (SELECT arrayJoin(audit_old) AS o)"""


def _kind_columns(name: str) -> tuple[list[str], str]:
    """The SELECT list of the pass's kinds over a flags row, and the condition of a row
    where one is set (the query's settings applied here: the keyless window, whether
    grants are required)."""
    pol = policy()
    if name == "keyless":
        w_ns = pol.keyless_window_s * 1_000_000_000
        cond = f"keyless_gap_ns IS NOT NULL AND keyless_gap_ns <= {w_ns}"
        return [f"{cond} AS keyless_duplicate_write"], cond
    exprs, mask = [], 0
    for kind in AUDIT_PASSES[name].kinds:
        bit = AUDIT_BITS["grant_absent" if kind == "missing_grant" else kind]
        if kind == "missing_grant" and not pol.require_grants:
            exprs.append("false AS missing_grant")
            continue
        exprs.append(f"bitTest(flags, {bit}) AS {kind}")
        mask |= 1 << bit
    return exprs, f"bitAnd(flags, {mask}) != 0"


def settled_audit_pass(name: str, db: str, window: Window, tenant: bool) -> str:
    """The audit pass `name` (same rows as its recomputation): the settled bits of the
    cohort and the handoffs related to a live one recomputed (for `budget` also those
    with an ack asked for and none stored at their settle: the query's clock decides), when the window was read against the
    settle state (Window.settled) and the audit flags were settled to the copy's
    watermark (for `keyless`, with a window at least the query's); else the whole pass
    recomputed."""
    p = AUDIT_PASSES[name]
    tw = "AND tenant = {tenant:String}" if tenant else ""
    st = window.settled
    pol = policy()
    window_s = pol.keyless_window_s
    longer = name == "keyless" and st is not None and window_s > st.audits_keyless_s
    grants = name == "grant_checks" and st is not None and pol.require_grants > st.audits_grants
    if st is None or not st.audits_match or longer or grants:
        return p.full(db, window, tenant)
    exprs, cond = _kind_columns(name)
    in_window = f"created >= {ts(window.start)} AND created < {ts(window.end)} {tw}"
    flags = f"""SELECT tenant, handoff_id, {", ".join(exprs)} FROM {db}.{AUDIT_FLAGS_TABLE} FINAL
    WHERE {cond} AND {in_window}"""
    live = [live_keys_sql(db, st.wm_sql, tw)] if st.live else []
    if name == "budget":
        live.append(
            f"SELECT tenant, handoff_id FROM {db}.{AUDIT_FLAGS_TABLE} FINAL"
            f" WHERE bitTest(flags, {AUDIT_BITS['ack_open']}) AND {in_window}"
        )
    if not live:
        return flags
    with_, related = _once(db, " UNION ALL ".join(live), p.relations, "audit_live", window_s)
    cols = ", ".join(p.kinds)
    return f"""{with_}
SELECT * FROM (
    {flags}
      AND (tenant, handoff_id) NOT IN ({related})
    UNION ALL
    SELECT tenant, handoff_id, {cols} FROM ({p.query(db, window, related)})
    WHERE 1 {tw}
)"""
