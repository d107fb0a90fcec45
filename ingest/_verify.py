"""Verify the ingest hash chain in the store: every batch's ledger rows and chain link.

For each ingest_batches row the store recomputes, in SQL (so it scales with the store):
- batch_hash = integrity.batch_hash(sorted row hashes of its transition_ledger rows)
  (a ledger row added, removed or rewritten changes it);
- chain_hash = integrity.chain(prev_chain_hash, batch_hash) (a batch row rewritten);
- prev_chain_hash is GENESIS or another batch's chain_hash (a batch row deleted);
- the ledger row count equals the batch's `transitions`.
Each serve instance writes one chain (foundation.ledger_instances); `heads` lists the chain
ends (one per instance; more: several writers of one instance, or a cut). `verify_ledger`
adds the signed logs (sql/007), each instance's on its own: every signed head against the
leaves as stored now (foundation.ledger_log.check_log), so a ledger rewritten with its
batch hashes and chain recomputed, a batch inserted or removed, or a truncated log is
found and its first bad position named; and every stored handoff_transitions row against
its ledger entry (`verify_rows`: row hash recomputed in Python from the hashed columns,
the typed columns from its attributes), so a row altered, added without an entry, or
deleted is named by handoff and span. One pass over both tables, streamed in key order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundation.integrity import GENESIS, derived_mismatches, row_hash
from foundation.ledger_log import LedgerLog, LogReport, check_log, read_heads, read_logs

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from foundation.keys import PublicKeys

__all__ = [
    "ChainReport",
    "LedgerReport",
    "RowsReport",
    "combine_logs",
    "verify_chain",
    "verify_ledger",
    "verify_rows",
]

_MAX_PROBLEMS = 100
#: seconds the rows check waits for a batch it read rows of to be named in ingest_batches
LATE_BATCH_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class ChainReport:
    batches: int
    heads: tuple[str, ...]
    problems: tuple[str, ...]  # at most 100, each naming the batch

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "batches": self.batches,
            "heads": list(self.heads),
            "problems": list(self.problems),
        }


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def verify_chain(
    client: Client, database: str, *, settle_s: float = LATE_BATCH_WAIT_S
) -> ChainReport:
    """Check every ingest batch of `database` (see the module doc); never raises on tampering.
    Ledger rows of a batch without its ingest_batches row are reported only when that row is
    still missing `settle_s` seconds later (serve writes it last: a write under way)."""
    db = database
    rows = client.query(
        f"""
        SELECT b.ingest_batch, b.transitions, l.n,
               lower(hex(SHA256(arrayStringConcat(ifNull(l.hashes, []), '')))) = b.batch_hash AS batch_ok,
               lower(hex(SHA256(concat(b.prev_chain_hash, b.batch_hash)))) = b.chain_hash AS link_ok,
               b.prev_chain_hash = '{GENESIS}'
                 OR b.prev_chain_hash IN (SELECT chain_hash FROM {db}.ingest_batches) AS prev_ok,
               b.chain_hash NOT IN (SELECT prev_chain_hash FROM {db}.ingest_batches) AS is_head,
               b.chain_hash
        FROM {db}.ingest_batches AS b
        LEFT JOIN (
            SELECT ingest_batch, arraySort(groupArray(toString(row_hash))) AS hashes, count() AS n
            FROM {db}.transition_ledger GROUP BY ingest_batch
        ) AS l ON l.ingest_batch = b.ingest_batch
        ORDER BY b.received_at, b.ingest_batch
        """,
        settings={"join_use_nulls": 1},
    ).result_rows
    problems: list[str] = []
    heads: list[str] = []
    for bid, transitions, n, batch_ok, link_ok, prev_ok, is_head, chain_hash in rows:
        n = n or 0
        if n != transitions:
            problems.append(f"batch {bid}: {n} ledger rows, the batch recorded {transitions}")
        elif not batch_ok:
            problems.append(f"batch {bid}: its ledger row hashes changed (batch_hash differs)")
        if not link_ok:
            problems.append(f"batch {bid}: chain_hash is not chain(prev_chain_hash, batch_hash)")
        if not prev_ok:
            problems.append(f"batch {bid}: follows a chain link no batch has (a batch was removed)")
        if is_head:
            heads.append(_s(chain_hash))
    orphans = frozenset(
        _s(b)
        for (b,) in client.query(
            f"SELECT DISTINCT ingest_batch FROM {db}.transition_ledger "
            f"WHERE ingest_batch NOT IN (SELECT ingest_batch FROM {db}.ingest_batches) LIMIT 10"
        ).result_rows
    )
    deadline = time.monotonic() + settle_s
    while orphans:
        _meanwhile, orphans = late_batches(orphans, _batches(client, db))
        if not orphans or time.monotonic() >= deadline:
            break
        time.sleep(0.2)  # polling the store: a write under way stores its batch row last
    problems += [f"ledger rows of batch {b} with no ingest_batches row" for b in sorted(orphans)]
    return ChainReport(len(rows), tuple(heads), tuple(problems[:_MAX_PROBLEMS]))


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """The chain check and the signed log check together; `require_signed`: a public key
    was given, so a log without signed heads is a failure, not a note."""

    chain: ChainReport
    log: LogReport
    rows: RowsReport
    require_signed: bool = False
    #: each serve instance's log and its report (several serves on one store, sql/010);
    #: `log` is them together, each problem and note prefixed with its instance
    instances: tuple[tuple[str, LogReport], ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        extra: tuple[str, ...] = ()
        if self.require_signed:
            extra = tuple(
                f"log{_of(i)}: no signed heads, though a public key was given"
                for i, r in self.instances or (("", self.log),)
                if r.heads == 0 and r.leaves
            )
        return (*self.chain.problems, *self.log.problems, *self.rows.problems, *extra)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            **self.chain.as_dict(),
            "ok": self.ok,
            "problems": list(self.problems),
            "log": _log_dict(self.log),
            "instances": {
                i: {**_log_dict(r), "ok": r.ok, "problems": list(r.problems)}
                for i, r in self.instances
            },
            "rows": {
                "checked": self.rows.rows,
                "problems": list(self.rows.problems),
                "late_rows": self.rows.late_rows,
            },
        }


def _log_dict(r: LogReport) -> dict:
    return {
        "leaves": r.leaves,
        "signed_heads": r.heads,
        "verified_leaves": r.verified_size,
        "unsigned_leaves": r.unsigned,
        "first_bad_position": r.first_bad,
        "notes": list(r.notes),
    }


def _of(instance: str) -> str:
    return f" of instance {instance}" if instance else ""


def combine_logs(reports: Sequence[tuple[str, LogReport]]) -> LogReport:
    """The reports of several instances' logs as one (pure): counts summed, each problem
    and note prefixed with its instance, the first bad position of the first instance with
    one. One log is itself (`instances` names it)."""
    if not reports:
        return LogReport(0, 0, 0, 0, None)
    if len(reports) == 1:
        return reports[0][1]
    bad = [r.first_bad for _i, r in reports if r.first_bad is not None]
    return LogReport(
        leaves=sum(r.leaves for _i, r in reports),
        heads=sum(r.heads for _i, r in reports),
        verified_size=sum(r.verified_size for _i, r in reports),
        unsigned=sum(r.unsigned for _i, r in reports),
        first_bad=bad[0] if bad else None,
        problems=tuple(f"instance {i or '(none)'}: {p}" for i, r in reports for p in r.problems),
        notes=tuple(f"instance {i or '(none)'}: {n}" for i, r in reports for n in r.notes),
    )


def verify_ledger(client: Client, database: str, keys: PublicKeys | None = None) -> LedgerReport:
    """verify_chain plus the whole log against its signed heads (signatures checked when
    `keys` are given); never raises on tampering."""
    chain_report = verify_chain(client, database)
    logs = read_logs(client, database)
    heads: dict[str, list] = {}
    for h in read_heads(client, database, None):
        heads.setdefault(h.instance, []).append(h)
    reports = tuple(
        (i, check_log(logs.get(i, LedgerLog(())), heads.get(i, []), keys))
        for i in sorted(set(logs) | set(heads))
    )
    rows_report = verify_rows(client, database)
    return LedgerReport(
        chain_report,
        combine_logs(reports),
        rows_report,
        require_signed=keys is not None,
        instances=reports,
    )


@dataclass(frozen=True, slots=True)
class RowsReport:
    rows: int  # handoff_transitions rows checked
    problems: tuple[str, ...]  # at most 100, each naming handoff and span
    late_rows: int = 0  # rows and ledger entries of batches stored during the check


_ROWS = """tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id, task_id, handoff_id,
    event, from_state, to_state, actor, attributes, valid, protocol, mode, from_agent, to_agent,
    topology, idempotency_key, payload_hash, deadline_ms, capabilities, evidence_refs,
    evidence_count, evidence_valid, error_code, fence_token, state_version, receipt_status,
    receipt_hash, claimed_tenant, ingest_batch"""


_PAGE = 20_000  # rows per read: pages end on a handoff boundary


def _query(client: Client, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    res = client.query(sql, parameters=params)
    return [dict(zip(res.column_names, r, strict=True)) for r in res.result_rows]


def _pages(client: Client, db: str, page: int) -> Iterator[tuple[list[dict], list[dict]]]:
    """(transition rows, ledger rows) of consecutive (tenant, handoff_id) ranges, each page
    ending on a handoff boundary, both in (tenant, handoff_id, span_id) order. Reads by
    primary key ranges (keyset pagination), one page in memory at a time."""
    after: tuple[str, str] | None = None
    while True:
        cond, params = "", {}
        if after is not None:
            cond, params = "WHERE (tenant, handoff_id) > ({t:String}, {h:String})", {
                "t": after[0], "h": after[1]}  # fmt: skip
        rows = _query(client, f"SELECT {_ROWS} FROM {db}.handoff_transitions {cond} "
                              f"ORDER BY tenant, handoff_id, span_id LIMIT {int(page)}", params)  # fmt: skip
        if not rows:
            break
        last = (_s(rows[-1]["tenant"]), _s(rows[-1]["handoff_id"]))
        if len(rows) == page:
            whole = [r for r in rows if (_s(r["tenant"]), _s(r["handoff_id"])) != last]
            if whole:  # the last handoff may go on: read it with the next page
                rows = whole
                last = (_s(rows[-1]["tenant"]), _s(rows[-1]["handoff_id"]))
            else:  # one handoff fills the page: read all of it
                rows = _query(client, f"SELECT {_ROWS} FROM {db}.handoff_transitions WHERE "
                                      "tenant = {t:String} AND handoff_id = {h:String} "
                                      "ORDER BY span_id", {"t": last[0], "h": last[1]})  # fmt: skip
        upper = "(tenant, handoff_id) <= ({t1:String}, {h1:String})"
        lcond = f"WHERE {cond.removeprefix('WHERE ')} AND {upper}" if cond else f"WHERE {upper}"
        ledger = _query(client, "SELECT tenant, handoff_id, span_id, toString(row_hash) AS "
                                f"row_hash, ingest_batch FROM {db}.transition_ledger {lcond} "
                                "ORDER BY tenant, handoff_id, span_id",
                        {**params, "t1": last[0], "h1": last[1]})  # fmt: skip
        yield rows, ledger
        after = last
    # ledger entries after the last stored handoff: their rows are gone
    cond, params = "", {}
    if after is not None:
        cond, params = "WHERE (tenant, handoff_id) > ({t:String}, {h:String})", {
            "t": after[0], "h": after[1]}  # fmt: skip
    tail = _query(client, "SELECT tenant, handoff_id, span_id, toString(row_hash) AS row_hash, "
                          f"ingest_batch FROM {db}.transition_ledger {cond} ORDER BY tenant, handoff_id, "
                          "span_id", params)  # fmt: skip
    if tail:
        yield [], tail


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((_s(r["tenant"]), _s(r["handoff_id"]), _s(r["span_id"])), []).append(r)
    return out


def _batches(client: Client, db: str) -> frozenset[str]:
    return frozenset(
        _s(b) for (b,) in client.query(f"SELECT ingest_batch FROM {db}.ingest_batches").result_rows
    )


def late_batches(
    late: frozenset[str], stored_after: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """Of the batches of rows and ledger entries read during a check but not stored when it
    began (`late`): (those stored meanwhile: written during the check, left out of it; those
    no stored batch names: rows nobody acknowledged). Pure."""
    return late & stored_after, late - stored_after


def _compare(
    rows: list[dict[str, Any]], entries_of: list[dict[str, Any]], problems: list[str]
) -> int:
    """Compare stored rows with ledger entries key by key, appending problems; returns the
    number of rows checked."""
    stored, ledger = _groups(rows), _groups(entries_of)
    checked = 0
    for k in sorted(set(stored) | set(ledger)):
        where = f"handoff {k[1]} span {k[2]} (tenant {k[0]})"
        entries = Counter(_s(e["row_hash"]) for e in ledger.get(k, []))
        hashes: Counter[str] = Counter()
        for r in stored.get(k, []):
            checked += 1
            r["attributes"] = {str(a): str(v) for a, v in dict(r["attributes"]).items()}
            hashes[row_hash(r)] += 1
            for c, have, want in derived_mismatches(r):
                problems.append(f"{where}: column {c} stored {have!r}, its hashed "
                                f"attributes say {want!r}")  # fmt: skip
        if hashes and not entries:
            problems.append(f"{where}: stored without a ledger entry (not written by "
                            "serve, or its entry deleted)")  # fmt: skip
        elif hashes - entries:
            problems.append(f"{where}: stored row does not match its ledger entry "
                            "(altered after ingest)")  # fmt: skip
        elif entries - hashes:
            problems.append(f"{where}: {(entries - hashes).total()} ledger entries "
                            "without their stored row (deleted from handoff_transitions)")  # fmt: skip
    return checked


def verify_rows(
    client: Client, database: str, *, page: int = _PAGE, settle_s: float = LATE_BATCH_WAIT_S
) -> RowsReport:
    """Every handoff_transitions row against transition_ledger, merged in key order (tenant,
    handoff_id, span_id): each row's recomputed row hash must have its own ledger entry,
    each ledger entry its row, and each typed column must be what the row's attributes
    derive. `page`: rows read at once (a page ends on a handoff boundary). Never raises on
    tampering.

    A live store keeps writing while it is checked: the check covers the batches stored
    when it began (serve writes a batch's rows and ledger entries before its ingest_batches
    row). Rows and entries of a batch stored later are left out and counted (`late_rows`);
    those of a batch that no ingest_batches row names `settle_s` seconds after the pages
    were read (time for a write under way to finish) are checked like the rest, so a forged
    row is named whatever batch it claims."""
    problems: list[str] = []
    checked = 0
    began = _batches(client, database)
    late: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for page_rows, page_ledger in _pages(client, database, page):
        kept: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
        for side, items in enumerate((page_rows, page_ledger)):
            for item in items:
                batch = _s(item.pop("ingest_batch"))
                (kept if batch in began else late.setdefault(batch, ([], [])))[side].append(item)
        checked += _compare(kept[0], kept[1], problems)
        if len(problems) >= _MAX_PROBLEMS:
            break
    deadline = time.monotonic() + settle_s
    while True:
        meanwhile, unknown = late_batches(frozenset(late), _batches(client, database))
        if not unknown or time.monotonic() >= deadline:
            break
        time.sleep(0.2)  # polling the store: a write under way stores its batch row last
    # rows of a batch no ingest_batches row names: checked like the rest, so each is named
    checked += _compare(
        [r for b in sorted(unknown) for r in late[b][0]],
        [e for b in sorted(unknown) for e in late[b][1]],
        problems,
    )
    late_rows = sum(len(late[b][0]) + len(late[b][1]) for b in meanwhile)
    return RowsReport(checked, tuple(problems[:_MAX_PROBLEMS]), late_rows)
