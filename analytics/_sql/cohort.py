"""Shared pieces of the analytics loaders: the window, time literals, dimensions, the cohort."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from analytics._sql import contract as cs
from analytics._sql.evidence_facts import declared_sql, failed_sql
from analytics._sql.watermarks import (
    AUDIT_FAILED_BIT,
    AUDIT_FLAGS_TABLE,
    COHORT_TABLE,
    COHORT_WATERMARK_TABLE,
    EPOCH,
    Settled,
    live_keys_sql,
    read_settled,
    watermark_sql,
)
from collector import semconv
from collector.semconv import DEFAULT_DEADLINE_MS, SETTLE_GRACE_MS
from foundation import settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

#: Dimensions every metric can be sliced by (`pair` is "from_agent->to_agent";
#: `capability` counts a handoff once under each capability it was granted, "" when none;
#: `schema_version`, `message_kind` and `contract_version` are read from the create span, ""
#: when it has none).
DIMENSIONS: Final = (
    "tenant",
    "pair",
    "from_agent",
    "to_agent",
    "mode",
    "topology",
    "protocol",
    "capability",
    "schema_version",
    "message_kind",
    "contract_version",
)
BUCKETS: Final = (None, "hour", "day")
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class Window:
    """A created-time window [start, end) of aware UTC datetimes; `as_of` the clock (None = now).

    The cohort is every handoff whose `create` transition time is in [start, end). `as_of`
    fixes the clock of the settle rule and of SLA ages, so a result is reproducible.
    `settled` is the store's settled-cohort state a query reads against
    (analytics._sql.watermarks.read_settled; see `against`): None, the cohort's SQL finds it
    itself (the same rows, at a few more reads per query). `checks_absent_since`: no create
    row at or after it declares an evidence check (as one query found it,
    `settled_window`), so a cohort starting there or later leaves the checks out of V(h)
    instead of planning them (None: the SQL reads them, finding nothing when none).
    """

    start: datetime
    end: datetime
    as_of: datetime | None = None
    settled: Settled | None = None
    checks_absent_since: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end", "as_of"):
            v = getattr(self, name)
            if v is None and name == "as_of":
                continue
            if not isinstance(v, datetime):
                raise TypeError(f"Window.{name} must be a datetime, got {type(v).__name__}")
            if v.tzinfo is None or v.utcoffset() is None:
                raise ValueError(f"Window.{name} must be timezone-aware (UTC), got naive {v}")
        if self.settled is not None and not isinstance(self.settled, Settled):
            raise TypeError(
                f"Window.settled must be an analytics._sql.watermarks.Settled or None, got {type(self.settled).__name__}"
            )
        if self.end <= self.start:
            raise ValueError(f"Window.end ({self.end}) must be after Window.start ({self.start})")
        absent = self.checks_absent_since
        if absent is not None and not isinstance(absent, datetime):
            raise TypeError(
                f"Window.checks_absent_since must be a datetime or None, got {type(absent).__name__}"
            )

    @classmethod
    def last(cls, hours: float = 24, *, as_of: datetime | None = None) -> Window:
        """The `hours` before as_of (default now), as_of included as the clock."""
        now = as_of or datetime.now(UTC)
        return cls(start=now - timedelta(hours=hours), end=now, as_of=as_of)

    def clock(self) -> datetime:
        return self.as_of or datetime.now(UTC)

    def shifted(self, delta: timedelta) -> Window:
        """The same window moved by delta (as_of moved too when set)."""
        return Window(
            start=self.start + delta,
            end=self.end + delta,
            as_of=None if self.as_of is None else self.as_of + delta,
            settled=self.settled,
        )

    def against(self, settled: Settled) -> Window:
        """This window read against the store's settled-cohort state `settled`."""
        return replace(self, settled=settled)


def settled_window(client: Client, db: str, window: Window, tenant: str | None) -> Window:
    """`window` read against the store's settled-cohort state as it is now (one small query),
    unless it already is; and whether any handoff since its start declares an evidence
    check (one more, stopping at the first)."""
    if window.settled is not None:
        return window
    window = window.against(read_settled(client, db, tenant))
    if client.query(declared_sql(db, ts(window.start))).result_rows:
        return window
    return replace(window, checks_absent_since=window.start)


def check_db(database: str | None) -> str:
    """The database name, defaulted from settings; ValueError unless a plain identifier."""
    db = settings.resolve(settings.DATABASE, database)
    if not _DB_NAME.match(db):
        raise ValueError(f"database name {db!r} is not a plain identifier")
    return db


def ns(t: datetime) -> int:
    """Integer nanoseconds since the epoch of an aware datetime."""
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t}: pass an aware UTC datetime")
    delta = t - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def ts(t: datetime) -> str:
    """SQL literal DateTime64(9,'UTC') of an aware datetime (built from an int: no injection)."""
    return f"fromUnixTimestamp64Nano(toInt64({ns(t)}), 'UTC')"


def check_dims(by: str | Iterable[str] | None) -> tuple[str, ...]:
    by = (by,) if isinstance(by, str) else tuple(by or ())
    for d in by:
        if d not in DIMENSIONS:
            raise ValueError(f"unknown dimension {d!r}; choose from {', '.join(DIMENSIONS)}")
    if len(set(by)) != len(by):
        raise ValueError(f"dimension repeated in by={by!r}")
    return by


def dim_expr(dim: str) -> str:
    """SQL over a summary row (after the per-handoff GROUP BY) for one dimension."""
    if dim == "pair":
        return "concat(from_agent, '->', to_agent)"
    if dim == "capability":
        return "arrayJoin(if(empty(capabilities), [''], capabilities))"
    return dim


def bucket_expr(bucket: str | None) -> str | None:
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of None, 'hour', 'day'; got {bucket!r}")
    if bucket is None:
        return None
    fn = "toStartOfHour" if bucket == "hour" else "toStartOfDay"
    return f"{fn}(toDateTime(created, 'UTC'))"


#: Per-handoff columns cohort_sql can add. The cohort reads the settled copy
#: (handoff_settled FINAL, ordered by created time: only the window's rows) of the handoffs
#: settled before the copy's watermark, and handoff_summary FINAL of the rest: parts that do
#: not overlap are not merged at read time (cheap once background merges caught up); WHERE
#: on non-key columns is applied after FINAL (optimize_move_to_prewhere_if_final is off),
#: so a handoff's create row and its later rows are combined first.
_EXTRA_COLUMNS: Final = {
    "task_id": "max(task_id)",
    "deadline_ms": "max(deadline_ms)",  # the envelope's own (deadline_eff defaults it)
    "protocol": "max(protocol)",
    "from_agent": "max(from_agent)",
    "to_agent": "max(to_agent)",
    "topology": "max(topology)",
    "idempotency_key": "max(idempotency_key)",
    "capabilities": "max(capabilities)",
    "t_accepted": "min(t_accepted)",
    "t_running": "min(t_running)",
    "t_result": "min(t_result)",
    "t_committed": "min(t_committed)",
    "t_unknown_in": "min(t_unknown_in)",
    "t_unknown_out": "min(t_unknown_out)",
    "first_seen": "min(first_seen)",
    "last_seen": "max(last_seen)",
    "transitions": "sum(transitions)",
    "uncounted": "sum(uncounted)",
}
#: Columns a dimension needs.
DIM_COLUMNS: Final = {
    "tenant": (),
    "pair": ("from_agent", "to_agent"),
    "from_agent": ("from_agent",),
    "to_agent": ("to_agent",),
    "mode": (),
    "topology": ("topology",),
    "protocol": ("protocol",),
    "capability": ("capabilities",),
    "schema_version": ("schema_version",),
    "message_kind": ("message_kind",),
    "contract_version": ("contract_version",),
}
#: Cohort columns read from the handoff's counted create rows (the greatest value; "" when
#: absent): not in handoff_summary, so only a cohort asking for one joins them in.
_CREATE_ATTR_COLUMNS: Final = {
    "schema_version": semconv.SCHEMA_VERSION,
    "message_kind": semconv.MESSAGE_KIND,
    "contract_version": semconv.CONTRACT_VERSION,
}


def cohort_sql(
    db: str,
    window: Window,
    *,
    tenant_param: bool,
    extra: Iterable[str] | None = None,
    last_state: bool = False,
    within: str | None = None,
) -> str:
    """SQL of one row per cohort handoff: tenant, handoff_id, created, deadline_eff (ms),
    mode, tmask, first_result, the `extra` columns asked for (only those are aggregated:
    the funnel over millions of handoffs stays cheap; None = all), optionally last_state,
    and the contract flags (Bool): is_settled, is_a, is_e, is_v_claimed (the first result's
    evidence marked valid by the emitter), is_v (claimed, and the checks the envelope
    declares pass: analytics/_sql/evidence_facts.py), is_k, is_unk (ever entered
    unknown), is_unresolved (entered and never left unknown), is_esc (mode escalate or
    reached escalated).
    """
    as_of = ts(window.clock())
    grace = SETTLE_GRACE_MS
    tenant_and = "AND tenant = {tenant:String}" if tenant_param else ""
    ok_bit = "(first_result != 65535 AND first_result % 2 = 1)"
    cols = list(_EXTRA_COLUMNS) if extra is None else sorted(set(extra))
    attr_cols = [c for c in cols if c in _CREATE_ATTR_COLUMNS]
    cols = [c for c in cols if c not in _CREATE_ATTR_COLUMNS]
    for c in cols:
        if c not in _EXTRA_COLUMNS:
            raise ValueError(f"unknown cohort column {c!r}")
    extra_sql = "".join(f"        {c},\n" for c in cols)
    last = f",\n    {cs.last_state_expr('tmask')} AS last_state" if last_state else ""
    columns = f"""SELECT tenant, handoff_id, created,
        coalesce(deadline_ms, {DEFAULT_DEADLINE_MS}) AS deadline_eff,
        mode,
{extra_sql}        tmask, first_result"""
    in_window = f"created >= {ts(window.start)} AND created < {ts(window.end)} {tenant_and}" + (
        f"\n       AND (tenant, handoff_id) IN ({within})" if within else ""
    )
    # the created and alive filters must see merged rows (a server may default this on)
    final = "SETTINGS optimize_move_to_prewhere_if_final = 0"
    copy = f"FROM {db}.{COHORT_TABLE} FINAL\n    WHERE alive AND {in_window}"
    summary = f"FROM {db}.handoff_summary FINAL\n    WHERE created IS NOT NULL AND {in_window}"
    st = window.settled
    if st is None:  # found by the SQL: each source guarded by the watermark
        wm = f"({watermark_sql(db, tenant_param, COHORT_WATERMARK_TABLE)})"
        keys = live_keys_sql(db, wm, tenant_and)
        live = f"(tenant, handoff_id) IN ({keys})"
        # a constant once the scalar is read: with no live handoff (a settled store) no row
        # is looked up in the live set
        no_live = f"(SELECT count() FROM ({keys})) = 0"
        sources = [
            f"{copy}\n       AND {wm} > {EPOCH} AND ({no_live} OR NOT {live})",
            f"{summary}\n       AND {wm} > {EPOCH} AND NOT {no_live} AND {live}",
            f"{summary}\n       AND NOT ({wm} > {EPOCH})",
        ]
    elif st.source == "summary":  # never settled, or most of the summary is live
        sources = [summary]
    elif st.source == "copy":  # everything settled
        sources = [copy]
    else:
        live = f"(tenant, handoff_id) IN ({live_keys_sql(db, st.wm_sql, tenant_and)})"
        sources = [f"{copy}\n       AND NOT {live}", f"{summary}\n       AND {live}"]
    union = "\n    UNION ALL\n".join(
        f"    SELECT * FROM (\n    {columns}\n    {src}\n    {final})" for src in sources
    )
    return f"""
SELECT *,
    {cs.has("tmask", cs.TERMINAL_MASK)}
        OR toUnixTimestamp64Nano({as_of}) - toUnixTimestamp64Nano(created)
           > (deadline_eff + {grace}) * 1000000 AS is_settled,
    {cs.has("tmask", cs.ACCEPTED_MASK)} AS is_a,
    {cs.has("tmask", cs.EXECUTED_MASK)} AS is_e,
    is_e AND {ok_bit} AS is_v_claimed,
    {_checked(db, window, tenant_and)} AS is_v,
    is_v AND {cs.has("tmask", cs.COMMITTED_MASK)} AS is_k,
    {cs.has("tmask", cs.UNKNOWN_IN_MASK)} AS is_unk,
    is_unk AND NOT {cs.has("tmask", cs.UNKNOWN_OUT_MASK)} AS is_unresolved,
    mode = 'escalate' OR {cs.has("tmask", cs.ESCALATED_MASK)} AS is_esc{last}
FROM (
{union}
){_create_attrs_join(db, window, tenant_and, attr_cols)}
"""


def _checked(db: str, window: Window, tenant_and: str) -> str:
    """SQL of V(h) over a cohort row: the emitter's claim, and no declared evidence check
    failing (analytics/_sql/evidence_facts.py); the claim alone when the window knows that no
    handoff since its start declares a check."""
    absent = window.checks_absent_since
    if absent is not None and absent <= window.start:
        return "is_v_claimed"
    since = ts(window.start)
    st = window.settled
    if st is None or not st.audits_match:
        failed = failed_sql(db, since, tenant_and)
        return f"is_v_claimed AND (tenant, handoff_id) NOT IN (\n{failed})"
    # the settled bit (analytics._sql.settled_audits) but the live handoffs, recomputed
    failed = f"""SELECT tenant, handoff_id FROM {db}.{AUDIT_FLAGS_TABLE} FINAL
    WHERE bitTest(flags, {AUDIT_FAILED_BIT}) AND created >= {since} AND created < {ts(window.end)} {tenant_and}"""
    if st.live:
        live = live_keys_sql(db, st.wm_sql, tenant_and)
        failed += f"""
      AND (tenant, handoff_id) NOT IN ({live})
    UNION ALL
    {failed_sql(db, since, tenant_and, live)}"""
    return f"is_v_claimed AND (tenant, handoff_id) NOT IN (\n{failed})"


def _create_attrs_join(db: str, window: Window, tenant_and: str, cols: list[str]) -> str:
    """LEFT JOIN of create-span attributes (_CREATE_ATTR_COLUMNS) onto the cohort's summary
    rows: only the cohort's counted create rows are read (PREWHERE on event, IN on the
    primary-key prefix). Empty when no such column is asked for."""
    if not cols:
        return ""
    sel = ", ".join(f"max(attributes['{_CREATE_ATTR_COLUMNS[c]}']) AS {c}" for c in cols)
    return f""" AS summary_rows
LEFT JOIN (
    SELECT tenant, handoff_id, {sel}
    FROM {db}.handoff_transitions
    PREWHERE event = 'create'
    WHERE valid AND from_state = '' AND to_state = 'created'
      AND (tenant, handoff_id) IN (
        SELECT tenant, handoff_id FROM {db}.handoff_summary
        WHERE created IS NOT NULL
          AND created >= {ts(window.start)} AND created < {ts(window.end)} {tenant_and})
    GROUP BY tenant, handoff_id
) AS create_attrs USING (tenant, handoff_id)"""
