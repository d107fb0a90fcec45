"""Verify the ingest hash chain in the store: every batch's ledger rows and chain link.

For each ingest_batches row the store recomputes, in SQL (so it scales with the store):
- batch_hash = integrity.batch_hash(sorted row hashes of its transition_ledger rows)
  (a ledger row added, removed or rewritten changes it);
- chain_hash = integrity.chain(prev_chain_hash, batch_hash) (a batch row rewritten);
- prev_chain_hash is GENESIS or another batch's chain_hash (a batch row deleted);
- the ledger row count equals the batch's `transitions`.
One serve writes one chain; `heads` lists the chain ends (more than one: several writers, or
a cut). `verify_ledger` adds the signed log (sql/007): every signed head against the
leaves as stored now (foundation.ledger_log.check_log), so a ledger rewritten with its
batch hashes and chain recomputed, a batch inserted or removed, or a truncated log is
found and its first bad position named. Row hashes against handoff_transitions are checked
per handoff by the evidence packages (analytics/), not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from foundation.integrity import GENESIS
from foundation.ledger_log import LogReport, check_log, read_heads, read_log

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from foundation.keys import PublicKeys

__all__ = ["ChainReport", "LedgerReport", "verify_chain", "verify_ledger"]

_MAX_PROBLEMS = 100


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


def verify_chain(client: Client, database: str) -> ChainReport:
    """Check every ingest batch of `database` (see the module doc); never raises on tampering."""
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
    ledger_orphans = client.query(
        f"SELECT DISTINCT ingest_batch FROM {db}.transition_ledger "
        f"WHERE ingest_batch NOT IN (SELECT ingest_batch FROM {db}.ingest_batches) LIMIT 10"
    ).result_rows
    problems += [f"ledger rows of batch {b} with no ingest_batches row" for (b,) in ledger_orphans]
    return ChainReport(len(rows), tuple(heads), tuple(problems[:_MAX_PROBLEMS]))


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """The chain check and the signed log check together; `require_signed`: a public key
    was given, so a log without signed heads is a failure, not a note."""

    chain: ChainReport
    log: LogReport
    require_signed: bool = False

    @property
    def problems(self) -> tuple[str, ...]:
        extra: tuple[str, ...] = ()
        if self.require_signed and self.log.heads == 0 and self.log.leaves:
            extra = ("log: no signed heads, though a public key was given",)
        return (*self.chain.problems, *self.log.problems, *extra)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            **self.chain.as_dict(),
            "ok": self.ok,
            "problems": list(self.problems),
            "log": {
                "leaves": self.log.leaves,
                "signed_heads": self.log.heads,
                "verified_leaves": self.log.verified_size,
                "unsigned_leaves": self.log.unsigned,
                "first_bad_position": self.log.first_bad,
                "notes": list(self.log.notes),
            },
        }


def verify_ledger(client: Client, database: str, keys: PublicKeys | None = None) -> LedgerReport:
    """verify_chain plus the whole log against its signed heads (signatures checked when
    `keys` are given); never raises on tampering."""
    chain_report = verify_chain(client, database)
    log_report = check_log(read_log(client, database), read_heads(client, database), keys)
    return LedgerReport(chain_report, log_report, require_signed=keys is not None)
