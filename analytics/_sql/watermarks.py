"""Where the settle job stands (analytics._sql.settled; sql/013, sql/014): the watermark tables
and the SQL a query uses to tell the settled handoffs from the live ones.

A handoff is settled for a watermark when every one of its handoff_anomaly_state rows was
touched (inserted) before it: the settle job wrote its state flags and its cohort row for
that watermark. The handoffs touched at or after it are live: a query reads their rows as
they are now. Any watermark at or below the true one gives the same result (more handoffs
read live), so an all-tenant query takes the least of the tenants' watermarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from analytics._sql.anomaly_state import TABLE as STATE_TABLE

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "AUDIT_FAILED_BIT",
    "AUDIT_FLAGS_TABLE",
    "AUDIT_WATERMARK_TABLE",
    "COHORT_COLUMNS",
    "COHORT_TABLE",
    "COHORT_WATERMARK_TABLE",
    "EPOCH",
    "FLAGS_TABLE",
    "GRANULE_ROWS",
    "RELATION_FLAGS_TABLE",
    "RELATION_WATERMARK_TABLE",
    "WATERMARK_TABLE",
    "Settled",
    "live_keys_sql",
    "read_settled",
    "watermark_sql",
]

FLAGS_TABLE: Final = "handoff_state_flags"
#: per tenant, the watermark of the state flags
WATERMARK_TABLE: Final = "anomaly_settle"
#: per settled handoff its merged handoff_summary row, ordered by created time
COHORT_TABLE: Final = "handoff_settled"
#: handoff_summary's columns, which handoff_settled holds besides `alive` and `version`
COHORT_COLUMNS: Final = (
    "tenant",
    "handoff_id",
    "task_id",
    "created",
    "first_seen",
    "last_seen",
    "deadline_ms",
    "protocol",
    "mode",
    "from_agent",
    "to_agent",
    "topology",
    "idempotency_key",
    "capabilities",
    "tmask",
    "first_result",
    "t_accepted",
    "t_running",
    "t_result",
    "t_committed",
    "t_unknown_in",
    "t_unknown_out",
    "transitions",
    "uncounted",
)
#: per tenant, the watermark of the settled cohort rows
COHORT_WATERMARK_TABLE: Final = "cohort_settle"
#: per settled handoff with a relation kind set, its flags (analytics._sql.settled_relations)
RELATION_FLAGS_TABLE: Final = "handoff_relation_flags"
#: per tenant, the watermark of the relation flags
RELATION_WATERMARK_TABLE: Final = "relation_settle"
#: per settled handoff with an audit bit or a keyless gap (analytics._sql.settled_audits)
AUDIT_FLAGS_TABLE: Final = "handoff_audit_flags"
#: per tenant, the watermark of the audit flags
AUDIT_WATERMARK_TABLE: Final = "audit_settle"
#: the audit bit of a result failing a declared evidence check (V(h) leaves it out)
AUDIT_FAILED_BIT: Final = 4
#: the watermark of a store (or tenant) no settle has reached
EPOCH: Final = "toDateTime64(0, 3, 'UTC')"


def watermark_sql(db: str, tenant: bool, table: str = WATERMARK_TABLE) -> str:
    """Scalar SQL: the watermark (DateTime64(3)) a query may use from `table`, the epoch
    when none: the tenant's, or over all tenants the least of each tenant's latest."""
    if tenant:
        return f"SELECT max(watermark) FROM {db}.{table} WHERE tenant = {{tenant:String}}"
    return f"SELECT min(w) FROM (SELECT max(watermark) AS w FROM {db}.{table} GROUP BY tenant)"


def live_keys_sql(db: str, wm: str, tenant_and: str = "") -> str:
    """The (tenant, handoff_id) of the handoffs live for watermark `wm` (a SQL expression):
    none when `wm` is the epoch (nothing is settled, so the caller reads every handoff as
    it is); the skip index on `touched` leaves the parts written before `wm` unread."""
    return (
        f"SELECT tenant, handoff_id FROM {db}.{STATE_TABLE}"
        f" WHERE {wm} > {EPOCH} AND touched >= {wm} {tenant_and}"
    )


#: rows per granule of the per-handoff tables (ClickHouse's default index_granularity)
GRANULE_ROWS: Final = 8192


@dataclass(frozen=True, slots=True)
class Settled:
    """The settled cohort's state as one query found it: the copy's watermark (ms since the
    epoch; 0 = none), how many handoffs were live for it (touched since) and how many rows
    the copy holds (about the store's handoffs); `flags_ms` is the state flags' watermark
    (0 = none, None = not read): the state pass reads the flags with this state only when
    it is the copy's, so that the same handoffs are live for both; `relations_ms` the same
    for the relation flags (bounce and the retry kinds), `audits_ms` for the audit flags and
    `audits_keyless_s` the keyless window they were settled with (seconds) and
    `audits_grants` whether that settle required grants (missing_grant kept)."""

    watermark_ms: int
    live: int
    stored: int = 0
    flags_ms: int | None = None
    relations_ms: int | None = None
    audits_ms: int | None = None
    audits_keyless_s: int = 0
    audits_grants: bool = False

    @property
    def flags_match(self) -> bool:
        """Whether the state flags were settled to the copy's watermark (the live handoffs
        are then the same for both)."""
        return self.flags_ms is not None and self.flags_ms == max(self.watermark_ms, 0)

    @property
    def relations_match(self) -> bool:
        """Whether the relation flags were settled to the copy's watermark."""
        return self.relations_ms is not None and self.relations_ms == max(self.watermark_ms, 0)

    @property
    def audits_match(self) -> bool:
        """Whether the audit flags were settled to the copy's watermark (and it is one)."""
        return self.watermark_ms > 0 and self.audits_ms == self.watermark_ms

    @property
    def wm_sql(self) -> str:
        return f"fromUnixTimestamp64Milli(toInt64({self.watermark_ms}), 'UTC')"

    @property
    def source(self) -> str:
        """What a cohort reads: "summary" (nothing settled; or so many live handoffs that
        their summary rows, spread over the summary's granules by their random ids, are
        most of its granules, and the copy would be read on top for little), "copy"
        (nothing live), else "both" (the copy but the live handoffs, and their summary
        rows)."""
        if self.watermark_ms <= 0:
            return "summary"
        if self.live == 0:
            return "copy"
        if self.live * 2 * GRANULE_ROWS > max(self.stored, 1):
            return "summary"
        return "both"


def read_settled(client: Client, db: str, tenant: str | None) -> Settled:
    """The settled cohort's state for a query by `tenant` (None = all tenants): with it a
    cohort reads only the sources it needs (analytics._sql.cohort.cohort_sql); a settle
    after this read only makes the copy fresher."""
    params: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
    wm = f"({watermark_sql(db, tenant is not None, COHORT_WATERMARK_TABLE)})"
    tenant_and = "" if tenant is None else "AND tenant = {tenant:String}"
    live = live_keys_sql(db, wm, tenant_and)
    flags, relations, audits = (
        f"({watermark_sql(db, tenant is not None, t)})"
        for t in (WATERMARK_TABLE, RELATION_WATERMARK_TABLE, AUDIT_WATERMARK_TABLE)
    )
    policy_of = f"FROM {db}.{AUDIT_WATERMARK_TABLE} FINAL WHERE 1 {tenant_and}"
    ms, n, stored, flags_ms, rel_ms, aud_ms, keyless_s, grants = client.query(
        f"SELECT toUnixTimestamp64Milli({wm}), (SELECT count() FROM ({live})),"
        f" (SELECT count() FROM {db}.{COHORT_TABLE}), toUnixTimestamp64Milli({flags}),"
        f" toUnixTimestamp64Milli({relations}), toUnixTimestamp64Milli({audits}),"
        f" (SELECT min(keyless_window_s) {policy_of}), (SELECT min(require_grants) {policy_of})",
        parameters=params,
    ).result_rows[0]
    flags_ms, rel_ms, aud_ms = (max(int(v or 0), 0) for v in (flags_ms, rel_ms, aud_ms))
    if (ms or 0) <= 0:
        return Settled(0, 0, flags_ms=flags_ms, relations_ms=rel_ms, audits_ms=aud_ms)
    return Settled(
        int(ms),
        int(n or 0),
        int(stored or 0),
        flags_ms,
        rel_ms,
        aud_ms,
        int(keyless_s or 0),
        bool(grants),
    )
