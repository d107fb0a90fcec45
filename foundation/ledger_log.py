"""The ledger log: its leaves read from a store, its signed heads, and the pure check of one
against the other.

Leaves (sql/007_ledger_heads.sql): the transition_ledger row hashes, batch by batch in the
order of the ingest hash chain (foundation.integrity.chain_order), each batch's hashes
sorted ascending. `read_log` and `read_heads` are the thin I/O; `check_log` is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from foundation.integrity import chain_order, log_entry
from foundation.keys import PublicKeys, SignedHead
from foundation.merkle import Frontier, leaf_hash

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "LedgerLog",
    "LogBatch",
    "LogReport",
    "check_log",
    "read_heads",
    "read_leaves",
    "read_log",
]

_MAX_PROBLEMS: Final = 100


@dataclass(frozen=True, slots=True)
class LogBatch:
    ingest_batch: str
    chain_hash: str
    transitions: int  # as ingest_batches recorded it
    row_hashes: tuple[str, ...]  # its ledger rows' hashes, sorted


@dataclass(frozen=True, slots=True)
class LedgerLog:
    """The log as the store holds it now: batches in chain order, then the unreachable ones."""

    batches: tuple[LogBatch, ...]
    unreachable: tuple[str, ...] = ()

    def entries(self) -> list[str]:
        """Row hashes in leaf order (hex)."""
        return [h for b in self.batches for h in b.row_hashes]

    def leaves(self) -> list[bytes]:
        return [leaf_hash(log_entry(h)) for h in self.entries()]

    def batch_at(self, leaf: int) -> tuple[int, str]:
        """(position in chain order, batch id) of the batch holding leaf index `leaf`."""
        seen = 0
        for i, b in enumerate(self.batches):
            seen += len(b.row_hashes)
            if leaf < seen:
                return i, b.ingest_batch
        return len(self.batches), ""

    def batches_up_to(self, size: int) -> int:
        """How many whole batches the first `size` leaves are (-1: `size` splits a batch)."""
        seen = 0
        for i, b in enumerate(self.batches):
            if seen == size:
                return i
            seen += len(b.row_hashes)
        return len(self.batches) if seen == size else -1


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_log(client: Client, database: str) -> LedgerLog:
    """Every batch of `database` with its ledger row hashes (two queries: the batches, then
    the ledger grouped by batch)."""
    db = database
    rows = client.query(
        f"""SELECT ingest_batch, prev_chain_hash, chain_hash,
                   toUnixTimestamp64Nano(toDateTime64(received_at, 9)), transitions
            FROM {db}.ingest_batches"""
    ).result_rows
    hashes: dict[str, list[str]] = {
        _s(b): [_s(h) for h in hs]
        for b, hs in client.query(
            f"""SELECT ingest_batch, arraySort(groupArray(toString(row_hash)))
                FROM {db}.transition_ledger GROUP BY ingest_batch"""
        ).result_rows
    }
    info = {_s(b): (_s(p), _s(c), int(t), int(n)) for b, p, c, t, n in rows}
    ordered, unreachable = chain_order([(b, p, c, t) for b, (p, c, t, _n) in info.items()])
    return LedgerLog(
        tuple(LogBatch(b, info[b][1], info[b][3], tuple(hashes.get(b, ()))) for b in ordered),
        tuple(unreachable),
    )


def read_leaves(client: Client, database: str) -> list[bytes]:
    """The log's Merkle leaf hashes in log order, hashed by the store (SHA-256 of 0x00 and
    the raw row hash): what a package's proofs need, half the bytes of read_log and no
    hashing here."""
    db = database
    rows = client.query(
        f"""SELECT ingest_batch, prev_chain_hash, chain_hash,
                   toUnixTimestamp64Nano(toDateTime64(received_at, 9))
            FROM {db}.ingest_batches"""
    ).result_rows
    ordered, _unreachable = chain_order([(_s(b), _s(p), _s(c), int(t)) for b, p, c, t in rows])
    leaves = {
        _s(b): hs
        for b, hs in client.query(
            f"""SELECT ingest_batch,
                       arrayMap(h -> SHA256(concat(unhex('00'), unhex(h))),
                                arraySort(groupArray(toString(row_hash))))
                FROM {db}.transition_ledger GROUP BY ingest_batch"""
        ).result_rows
    }
    return [bytes(h) if not isinstance(h, str) else h.encode("latin-1")
            for b in ordered for h in leaves.get(b, ())]  # fmt: skip


def read_heads(client: Client, database: str) -> list[SignedHead]:
    """Every signed head of `database`, by tree size then signing time."""
    rows = client.query(
        f"""SELECT tree_size, toString(root), toUnixTimestamp64Nano(signed_at), batches,
                   toString(chain_hash), key_id, signature
            FROM {database}.ledger_heads ORDER BY tree_size, signed_at"""
    ).result_rows
    return [
        SignedHead(int(n), _s(r), int(t), int(b), _s(c), _s(k), _s(sig))
        for n, r, t, b, c, k, sig in rows
    ]


@dataclass(frozen=True, slots=True)
class LogReport:
    """`check_log`'s answer. `first_bad`: the first leaf position the signed heads do not
    vouch for (None: all good); `verified_size`: leaves covered by the largest head that
    matched; `unsigned`: leaves after the last head (stored since, not yet signed)."""

    leaves: int
    heads: int
    verified_size: int
    unsigned: int
    first_bad: int | None
    problems: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def check_log(log: LedgerLog, heads: Sequence[SignedHead], keys: PublicKeys | None) -> LogReport:
    """Check the store's log against its signed heads (pure): each head's signature (when
    `keys` are given), each head's root against the root of that many leaves as stored now,
    heads of one size agreeing, and the chain reaching every batch. O(leaves) hashes."""
    problems: list[str] = []
    notes: list[str] = []
    leaves = log.leaves()
    n = len(leaves)
    first_bad: int | None = None
    verified = 0

    def bad(at: int, msg: str) -> None:
        nonlocal first_bad
        first_bad = at if first_bad is None else min(first_bad, at)
        problems.append(msg)

    if keys is None:
        notes.append("signatures not checked (no public key given)")
    frontier = Frontier()
    by_size: dict[int, str] = {}
    for h in sorted(heads, key=lambda h: (h.tree_size, h.signed_at)):
        what = f"head of size {h.tree_size} signed at {h.signed_at} ns by key {h.key_id}"
        if keys is not None and (err := keys.check(h)):
            bad(verified, f"{what}: {err}")
            continue
        if h.tree_size in by_size and by_size[h.tree_size] != h.root:
            bad(verified, f"{what}: another head of the same size has a different root (a fork)")
            continue
        by_size[h.tree_size] = h.root
        if h.tree_size > n:
            bad(n, f"{what}: the store holds only {n} leaves (the log was truncated: "
                   f"{h.tree_size - n} signed leaves are gone)")  # fmt: skip
            continue
        frontier = frontier.extend(leaves[frontier.size : h.tree_size])
        if frontier.root().hex() != h.root:
            pos, bid = log.batch_at(verified)
            bad(verified, f"{what}: the stored leaves {verified}..{h.tree_size - 1} do not "
                          f"match it (first bad position at or after leaf {verified}, batch "
                          f"#{pos} {bid})")  # fmt: skip
            continue
        if first_bad is None:
            verified = h.tree_size
    for b in log.batches:
        if len(b.row_hashes) != b.transitions:
            bad(0 if first_bad is None else first_bad,
                f"batch {b.ingest_batch}: {len(b.row_hashes)} ledger rows, the batch recorded "
                f"{b.transitions}")  # fmt: skip
    for bid in log.unreachable:
        problems.append(f"batch {bid}: not reachable along the chain from GENESIS "
                        "(a chain link was removed or rewritten)")  # fmt: skip
    last = max((h.tree_size for h in heads), default=0)
    unsigned = max(n - last, 0)
    if not heads and n:
        notes.append(f"no signed heads: the log's {n} leaves are unsigned")
    elif unsigned:
        notes.append(f"{unsigned} leaves stored after the last signed head (not yet signed)")
    return LogReport(
        leaves=n,
        heads=len(heads),
        verified_size=verified,
        unsigned=unsigned,
        first_bad=first_bad,
        problems=tuple(problems[:_MAX_PROBLEMS]),
        notes=tuple(notes),
    )
