"""Which of the store's anomaly kinds flag one handoff: the fast evaluators, and the anomaly
passes themselves for every kind no evaluator covers.

The report's passes (analytics._sql.anomalies) are built for windows of millions of handoffs:
asked about one handoff they still pay their fixed cost (store-wide candidate sets, the
settle state's live remainder), 20-400 ms each on a store of a few thousand handoffs, over
a second for all of them (bench/evidence_findings.py times packages; docs/auditors.md). So a kind whose verdict
the package can reach from a few rows read by primary key has an evaluator here, computed by
the pure oracle the pass is property-tested against (analytics.oracle.funnel,
oracle.audit, oracle.topology, the spike SQL of one hour); every other kind of the
pass registry, a kind added tomorrow included, is asked of its pass, restricted to the
handoff (analytics.evidence._findings.pass_findings_sql), two passes at a time.

EVALUATORS (name -> kinds it covers, function): a kind is covered only where its oracle sees
every row the pass would read for that handoff. oracle.audit and oracle.inferred pair
a handoff with its task's other handoffs, the holders of its idempotency key in any task and
the handoffs its retry_of and causation_id name: Neighbourhood.related_rows reads exactly
those (one query); a pairing by another relation must be read there too, or its kind left
to the pass. Kinds whose pass must read a population (fan_out_all, sustained_rejections,
keyless_duplicate_write, consumer_stalled) are asked of the pass only when the handoff's own
rows allow the kind at all (_pass_if). The per-kind test
(tests/integration/test_evidence_findings.py) and bench/evidence_findings.py on a demo
store check that packages and the report agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.rows import fetch_rows
from analytics.oracle import funnel as ref
from analytics.oracle.audit import audit_anomalies, is_create
from collector import semconv as sc
from foundation.store import query_each

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from analytics._sql.cohort import Window

__all__ = ["EVALUATORS", "Evaluator", "Neighbourhood", "evaluate", "partners"]

Row = Mapping[str, Any]
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    """What an evaluator reads: the handoff's own rows (every column), its task's rows
    (analytics.evidence._store_reads.fetch_task_rows), the window its kinds are asked over (`as_of`
    the package's time), and where to read more."""

    client: Client
    db: str
    tenant: str
    handoff_id: str
    rows: Sequence[Row]
    task_rows: Sequence[Row]
    window: Window
    #: the window read against the store's settle state, once a pass needs it
    _settled: list[Window] = field(default_factory=list, repr=False, compare=False)
    #: the related handoffs' rows (related_rows), once an evaluator needs them
    _related: list[list[Row]] = field(default_factory=list, repr=False, compare=False)

    @property
    def create(self) -> Row | None:
        """Its earliest counted-shape create row (the envelope), None for an orphan."""
        cr = [r for r in self.rows if is_create(r)]
        return min(cr, key=lambda r: (int(r["time_ns"]), str(r["span_id"]))) if cr else None

    def envelope(self, column: str, attribute: str = "") -> str:
        """A create-row column (or, with `attribute`, that attribute), "" when absent."""
        c = self.create
        if c is None:
            return ""
        return str(
            (c.get("attributes") or {}).get(attribute, "") if attribute else c.get(column) or ""
        )

    def settled(self) -> Window:
        """The window read against the store's settle state (one small query, the first
        time): a pass then reads the settled copies and flags instead of recomputing."""
        from analytics._sql.cohort import settled_window

        if not self._settled:
            self._settled.append(settled_window(self.client, self.db, self.window, None))
        return self._settled[0]

    def pass_sql(self, name: str, kinds: Sequence[str]) -> str:
        """SQL of the kinds among `kinds` pass `name` flags the handoff with."""
        from analytics.evidence._findings import pass_findings_sql

        return pass_findings_sql(name, self.db, self.settled(), kinds)

    def keys(self) -> list[str]:
        """The idempotency keys of its create rows."""
        return sorted(
            {
                r["idempotency_key"]
                for r in self.rows
                if r["event"] == "create" and r["idempotency_key"]
            }
        )

    def related_rows(self) -> list[Row]:
        """Its own rows and every row (all columns) of the handoffs related to it, read once
        (by primary key but for the key holders): its task's other handoffs (attempts
        paired by task, the task's versions), every handoff of the tenant with a create
        holding one of its idempotency keys, and the ones its retry_of and causation_id
        name. Its own rows alone when it has none of those."""
        if self._related:
            return self._related[0]
        c = self.create
        keys = self.keys()
        a = (c or {}).get("attributes") or {}
        named = [x for x in (str(a.get(sc.RETRY_OF) or ""), str(a.get(sc.CAUSATION_ID) or "")) if x]
        task = str((c or self.rows[0]).get("task_id") or "")
        siblings = bool(task) and any(r["handoff_id"] != self.handoff_id for r in self.task_rows)
        rows: list[Row] = []
        if keys or named or siblings:
            where = ["handoff_id IN {ids:Array(String)}"]
            if keys:
                where.append(f"""handoff_id IN (SELECT handoff_id FROM {self.db}.handoff_transitions
                    WHERE tenant = {{t:String}} AND event = 'create'
                      AND idempotency_key IN {{k:Array(String)}})""")
            if siblings:
                where.append(f"""handoff_id IN (SELECT handoff_id FROM {self.db}.handoff_tasks
                    WHERE tenant = {{t:String}} AND task_id = {{task:String}})""")
            rows += fetch_rows(
                self.client,
                self.db,
                f"tenant = {{t:String}} AND handoff_id != {{h:String}} AND ({' OR '.join(where)})",
                {"t": self.tenant, "h": self.handoff_id, "ids": named, "k": keys, "task": task},
            )
        self._related.append([*self.rows, *rows])
        return self._related[0]

    @property
    def created_ns(self) -> int | None:
        c = self.create
        return int(c["time_ns"]) if c is not None else None

    @property
    def params(self) -> dict[str, str]:
        return {"handoff_tenant": self.tenant, "handoff": self.handoff_id}

    def ask_pass(self, name: str, kinds: Sequence[str]) -> set[str]:
        """The kinds among `kinds` pass `name` flags the handoff with (one query)."""
        sql = self.pass_sql(name, kinds)
        return {str(k) for (k,) in self.client.query(sql, parameters=self.params).result_rows}


@dataclass(frozen=True, slots=True)
class Evaluator:
    """`kinds`: the kinds `fn` decides (a callable: computed when asked, for an oracle whose
    kinds are all its own rows'); `fn` returns those of them that flag the handoff.
    `pairwise`: `fn` decides from Neighbourhood.related_rows by pairs (the handoff and one
    other), so `partners` can name the other handoffs a kind involves."""

    kinds: frozenset[str] | Callable[[], frozenset[str]]
    fn: Callable[[Neighbourhood], set[str]]
    pairwise: bool = False

    def covers(self) -> frozenset[str]:
        return self.kinds() if callable(self.kinds) else self.kinds


def _task(n: Neighbourhood) -> set[str]:
    """stale_fence and bounce from the task's rows (analytics.oracle.funnel.task_anomalies)."""
    return set(ref.task_anomalies(n.task_rows, n.handoff_id))


#: the cross kinds oracle.audit pairs from the attempts the neighbourhood reads
_ATTEMPT_KINDS: Final = frozenset(
    {"blind_retry", "duplicate_execution", "consumed_before_verified", "expired_receipt_used"}
)


def _related(n: Neighbourhood) -> set[str]:
    """idempotency_conflict (a key of its creates created by any handoff of the tenant with
    two payload hashes), and the retry and causation kinds (oracle.audit.audit_anomalies),
    over its related handoffs' rows (Neighbourhood.related_rows)."""
    keys = n.keys()
    every = n.related_rows()
    hashes = {
        r["payload_hash"]
        for r in every
        if r["event"] == "create" and r["idempotency_key"] in keys and r["payload_hash"]
    }
    found = {"idempotency_conflict"} if len(hashes) > 1 else set()
    if n.create is not None:
        found |= set(audit_anomalies(every).get((n.tenant, n.handoff_id), ())) & _ATTEMPT_KINDS
    return found


#: what oracle.budget computes from one handoff's own rows (and the clock)
_BUDGET_KINDS: Final = frozenset({"deadline_overrun", "tool_budget_exceeded", "ack_missing"})


def _budget(n: Neighbourhood) -> set[str]:
    """The envelope's time and effort promises from its own rows at the package's clock
    (analytics.oracle.budget.budget_kinds)."""
    from analytics._sql.cohort import ns
    from analytics.oracle.budget import budget_kinds

    return set(budget_kinds(n.rows, as_of_ns=ns(n.window.clock()))) & _BUDGET_KINDS


#: the inferred kinds (analytics.oracle.inferred) its related handoffs decide: a refused
#: attempt it retries (retry_of, or inferred within its task), the grant, the task's versions
_INFERRED_KINDS: Final = frozenset(
    {"retry_after_final_refusal", "grant_caller_mismatch", "missing_grant", "out_of_order_version"}
)


def _inferred(n: Neighbourhood) -> set[str]:
    """oracle.inferred.inferred_anomalies over its related handoffs' rows, with the
    policy the pass uses (HANDOFFS_KEYLESS_WINDOW_S, HANDOFFS_REQUIRE_GRANTS)."""
    from analytics._sql.inferred_policy import policy
    from analytics.oracle.inferred import inferred_anomalies

    t = n.created_ns
    if t is None:
        return set()
    got = inferred_anomalies(n.related_rows(), start_ns=t, end_ns=t + 1, pol=policy())
    return set(got.get((n.tenant, n.handoff_id), ())) & _INFERRED_KINDS


def _topology_kinds() -> frozenset[str]:
    from analytics.oracle.topology import TOPOLOGY_KINDS

    # fan_out_all compares the orchestrator's other tasks: its pass reads them
    return frozenset(TOPOLOGY_KINDS) - {"fan_out_all"}


def _topology(n: Neighbourhood) -> set[str]:
    """Each topology's own kinds of its own rows (oracle.topology), with the thresholds
    the topology pass uses (the HANDOFFS_* settings)."""
    from analytics._sql.topology import thresholds
    from analytics.oracle.topology import topology_anomalies

    c = n.create
    if c is None:
        return set()
    t = int(c["time_ns"])
    got = topology_anomalies(n.rows, start_ns=t, end_ns=t + 1, th=thresholds())
    return set(got.get((n.tenant, n.handoff_id), ())) & _topology_kinds()


def _spike(n: Neighbourhood) -> set[str]:
    """rejection_spike: a rejected handoff whose (to_agent, capability) group spiked in the
    hour of its creation (the spike SQL of that one hour and its baseline, all tenants, at
    the window's clock and settle state)."""
    from analytics._sql.cohort import Window
    from analytics._sql.spikes import SPIKE_BASELINE_BUCKETS, SPIKE_BUCKET_S, spikes_sql

    c = n.create
    if c is None or "rejected" not in ref.facts(n.handoff_id, n.rows, as_of_ns=0).reached:
        return set()
    at = _EPOCH + timedelta(microseconds=int(c["time_ns"]) // 1000)
    one = Window(start=at, end=at + timedelta(microseconds=1), as_of=n.window.as_of,
                 settled=n.settled().settled)  # fmt: skip
    sql = spikes_sql(
        n.db, one, tenant=False, bucket_s=SPIKE_BUCKET_S, baseline=SPIKE_BASELINE_BUCKETS
    )
    to = str(c.get("to_agent") or "")
    caps = {str(x) for x in c.get("capabilities") or []} or {""}
    hit = any(
        str(agent) == to and str(cap) in caps
        for _b, agent, cap, *_rest in n.client.query(sql).result_rows
    )
    return {"rejection_spike"} if hit else set()


def _pass_if(
    kind: str, holds: Callable[[Neighbourhood], bool]
) -> Callable[[Neighbourhood], set[str]]:
    """Ask `kind`'s pass only when the handoff's own rows allow the kind at all."""

    def fn(n: Neighbourhood) -> set[str]:
        from analytics._sql.anomalies import KIND_PASS

        return n.ask_pass(KIND_PASS[kind], [kind]) if holds(n) else set()

    return fn


def _agent_as_tool(n: Neighbourhood) -> bool:
    """fan_out_all flags agent-as-tool calls to a named expert only."""
    c = n.create
    return c is not None and c.get("topology") == "agent_as_tool" and bool(c.get("to_agent"))


def _keyless_write(n: Neighbourhood) -> bool:
    """keyless_duplicate_write flags a committed write with a payload hash and no key."""
    c = n.create
    return (
        c is not None
        and not n.keys()
        and bool(c.get("payload_hash"))
        and any(r["to_state"] == "committed" and r.get("valid", True) for r in n.rows)
    )


def _queued(n: Neighbourhood) -> bool:
    """consumer_stalled flags a shared-queue message whose create says where it was queued."""
    c = n.create
    return (
        c is not None
        and c.get("topology") == "shared_queue"
        and sc.QUEUE_OFFSET in (c.get("attributes") or {})
    )


def _rejected(n: Neighbourhood) -> bool:
    """sustained_rejections flags rejected (settled) handoffs only."""
    return (
        n.create is not None and "rejected" in ref.facts(n.handoff_id, n.rows, as_of_ns=0).reached
    )


#: name -> what it covers and how; every other kind of the pass registry is asked of its pass
EVALUATORS: Final[Mapping[str, Evaluator]] = {
    "task": Evaluator(frozenset({"stale_fence", "bounce"}), _task),
    "related": Evaluator(_ATTEMPT_KINDS | {"idempotency_conflict"}, _related, pairwise=True),
    "topology": Evaluator(_topology_kinds, _topology),
    "spike": Evaluator(frozenset({"rejection_spike"}), _spike),
    "fan_out": Evaluator(frozenset({"fan_out_all"}), _pass_if("fan_out_all", _agent_as_tool)),
    "sustained": Evaluator(
        frozenset({"sustained_rejections"}), _pass_if("sustained_rejections", _rejected)
    ),
    "budget": Evaluator(_BUDGET_KINDS, _budget),
    "inferred": Evaluator(_INFERRED_KINDS, _inferred, pairwise=True),
    "keyless": Evaluator(
        frozenset({"keyless_duplicate_write"}),
        _pass_if("keyless_duplicate_write", _keyless_write),
    ),
    "stall": Evaluator(frozenset({"consumer_stalled"}), _pass_if("consumer_stalled", _queued)),
}


def evaluate(n: Neighbourhood, kinds: Sequence[str]) -> set[str]:
    """The kinds among `kinds` (each in the pass registry) that flag the handoff: by the
    evaluators covering them, the rest by their passes (one query per pass, two at a time
    when the client has a sibling: foundation.store.query_each)."""
    from analytics._sql.anomalies import KIND_PASS, PASSES

    wanted = {k for k in kinds if k in KIND_PASS}
    flagged: set[str] = set()
    for ev in EVALUATORS.values():
        mine = ev.covers() & wanted
        if mine:
            flagged |= ev.fn(n) & mine
            wanted -= mine
    jobs = []
    for name, pass_kinds in PASSES.items():
        mine_k = [k for k in pass_kinds if k in wanted]
        if mine_k:
            sql = n.pass_sql(name, mine_k)

            def job(c: Client, sql: str = sql) -> set[str]:
                return {str(k) for (k,) in c.query(sql, parameters=n.params).result_rows}

            jobs.append(job)
    for got in query_each(n.client, jobs):
        flagged |= got
    return flagged


def partners(n: Neighbourhood, kind: str) -> tuple[str, ...]:
    """The related handoffs (Neighbourhood.related_rows) each of which, with the handoff's own
    rows alone, makes `kind`'s pairwise evaluator flag it: the other handoffs it involves
    (sorted). Empty for a kind no pairwise evaluator covers, or one the handoff's own rows
    make (grant_caller_mismatch: no other handoff is needed)."""
    ev = next((e for e in EVALUATORS.values() if e.pairwise and kind in e.covers()), None)
    if ev is None:
        return ()
    by: dict[str, list[Row]] = {}
    for r in n.related_rows():
        if r["handoff_id"] != n.handoff_id:
            by.setdefault(str(r["handoff_id"]), []).append(r)
    alone = replace(n, _related=[list(n.rows)], _settled=n._settled)
    if kind in ev.fn(alone):
        return ()
    return tuple(
        sorted(
            h
            for h, rows in by.items()
            if kind in ev.fn(replace(n, _related=[[*n.rows, *rows]], _settled=n._settled))
        )
    )
