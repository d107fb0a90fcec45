"""The ledger log: its leaves read from a store, its signed heads, and the pure check of one
against the other.

Leaves (sql/007_ledger_heads.sql): the transition_ledger row hashes, batch by batch in the
order of the ingest hash chain (foundation.integrity.chain_order), each batch's hashes
sorted ascending. `read_log` and `read_heads` are the thin I/O; `check_log` is pure.

The signer also stores the log in pieces (sql/008_ledger_nodes.sql): each batch's position
and the hashes of its complete aligned subtrees of 2^CHUNK_LEVEL leaves and more.
`read_pieces` reads what proofs of a few leaves need from them (a handful of queries, O(log
n) nodes and a few chunks of leaves), so a package does not read the whole log.

Each serve instance has its own log (foundation.ledger_instances, sql/010): every reader
takes an `instance` ("" by default: the one log of a single serve) and reads only its
batches, heads and pieces.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from foundation.checkpoint import Checkpoint
from foundation.integrity import log_entry
from foundation.keys import PublicKeys, SignedHead
from foundation.ledger_heads import covers, newest_head, newest_heads, read_heads
from foundation.ledger_instances import (
    INSTANCE_SQL,
    has_instance_columns,
    instance_filter,
    one_instance,
    split_chains,
)
from foundation.merkle import (
    Frontier,
    consistency_proof_from,
    inclusion_proof_from,
    leaf_hash,
    pieces_needed,
    root,
    root_from,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "CHUNK_LEVEL",
    "LedgerLog",
    "LogBatch",
    "LogPieces",
    "LogReport",
    "check_checkpoint",
    "check_log",
    "covers",
    "newest_head",
    "newest_heads",
    "read_heads",
    "read_leaves",
    "read_log",
    "read_logs",
    "read_pieces",
]

_MAX_PROBLEMS: Final = 100
#: the stored subtrees start at 2^10 = 1,024 leaves: a proof hashes at most two chunks of
#: leaves, and the nodes table holds about n / 1,024 rows
CHUNK_LEVEL: Final = 10
#: a batch's ledger rows carry about its receive time (staged writes may differ): the window
#: either side a reader of its rows allows, in ms
_WINDOW_MS: Final = 3_600_000


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


def _links(client: Client, db: str) -> tuple[dict[str, list[str]], dict[str, list[str]], dict]:
    """Every batch's chain link and instance: split_chains's (ordered, unreachable) and
    id -> (chain_hash, transitions)."""
    rows = client.query(
        f"""SELECT ingest_batch, prev_chain_hash, chain_hash,
                   toUnixTimestamp64Nano(toDateTime64(received_at, 9)), transitions,
                   {INSTANCE_SQL}
            FROM {db}.ingest_batches"""
    ).result_rows
    links = [(_s(b), _s(p), _s(c), int(t), _s(i)) for b, p, c, t, _n, i in rows]
    info = {_s(b): (_s(c), int(n)) for b, _p, c, _t, n, _i in rows}
    return *split_chains(links), info


def read_logs(client: Client, database: str) -> dict[str, LedgerLog]:
    """Every instance's log: its batches with their ledger row hashes (two queries: the
    batches, then the ledger grouped by batch)."""
    db = database
    ordered, unreachable, info = _links(client, db)
    hashes: dict[str, list[str]] = {
        _s(b): [_s(h) for h in hs]
        for b, hs in client.query(
            f"""SELECT ingest_batch, arraySort(groupArray(toString(row_hash)))
                FROM {db}.transition_ledger GROUP BY ingest_batch"""
        ).result_rows
    }
    return {
        inst: LedgerLog(
            tuple(
                LogBatch(b, info[b][0], info[b][1], tuple(hashes.get(b, ())))
                for b in ordered.get(inst, [])
            ),
            tuple(unreachable.get(inst, [])),
        )
        for inst in sorted(set(ordered) | set(unreachable))
    }


def read_log(client: Client, database: str, instance: str | None = None) -> LedgerLog:
    """`instance`'s log (read_logs; None: the store's one log, foundation.ledger_instances.
    one_instance)."""
    instance = one_instance(client, database, instance)
    return read_logs(client, database).get(instance, LedgerLog(()))


def read_leaves(client: Client, database: str, instance: str | None = None) -> list[bytes]:
    """`instance`'s log's Merkle leaf hashes in log order (None: the store's one log),
    hashed by the store (SHA-256 of 0x00 and the raw row hash): what a package's proofs
    need, half the bytes of read_log and no hashing here."""
    db = database
    instance = one_instance(client, db, instance)
    ordered, _unreachable, _info = _links(client, db)
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
            for b in ordered.get(instance, []) for h in leaves.get(b, ())]  # fmt: skip


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


def check_checkpoint(log: LedgerLog, checkpoint: Checkpoint) -> tuple[str, ...]:
    """What is wrong with the store's log against a checkpoint an auditor kept (pure): it
    must reach the checkpoint's tree size (else the missing leaves and batches are named)
    and have the checkpoint's root at that size (else a fork). Its signature is checked
    apart (foundation.checkpoint.verify_note). O(checkpoint size) hashes."""
    leaves = log.leaves()
    n, size = len(leaves), checkpoint.tree_size
    of = f"the checkpoint of {checkpoint.signed_at}" if checkpoint.signed_at else "the checkpoint"
    if size > n:
        batches = checkpoint.batches
        which = (
            f"batches {len(log.batches) + 1}..{batches} of the log's chain"
            if batches is not None and batches > len(log.batches)
            else "batches after the log's last"
        )
        return (f"the store's log ends at tree size {n}; {of} covers {size}: leaves "
                f"{n}..{size - 1} ({which}) are missing (the store was rolled back or "
                "truncated)",)  # fmt: skip
    have = root(leaves[:size])
    if have != checkpoint.root:
        return (f"the store's log at tree size {size} has root {have.hex()}, {of} says "
                f"{checkpoint.root.hex()}: the store holds another log (a fork: leaves below "
                f"{size} were rewritten, removed or inserted)",)  # fmt: skip
    return ()


@dataclass(frozen=True, slots=True)
class LogPieces:
    """The stored pieces of the tree of `size` leaves a few proofs need (read_pieces):
    `index` maps a row hash to its first leaf index (below `size`)."""

    size: int
    index: Mapping[str, int]
    nodes: Mapping[tuple[int, int], bytes]
    chunks: Mapping[int, tuple[bytes, ...]]

    def _node(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]

    def _chunk(self, c: int) -> Sequence[bytes]:
        return self.chunks.get(c, ())

    def root(self) -> bytes:
        return root_from(self.size, self._node, self._chunk, chunk_level=CHUNK_LEVEL)

    def proof(self, index: int) -> list[bytes]:
        return inclusion_proof_from(
            self.size, index, self._node, self._chunk, chunk_level=CHUNK_LEVEL
        )

    def consistency(self, old_size: int) -> list[bytes]:
        """PROOF(old_size) to this tree (read_pieces with `old_size` among its old_sizes)."""
        return consistency_proof_from(
            old_size, self.size, self._node, self._chunk, chunk_level=CHUNK_LEVEL
        )


def _positions(
    client: Client, db: str, where: str, params: dict
) -> list[tuple[str, int, int, int]]:
    rows = client.query(
        f"""SELECT ingest_batch, any(first_leaf), any(leaves),
                   toUnixTimestamp64Milli(any(received_at))
            FROM {db}.ledger_positions WHERE {where} GROUP BY ingest_batch""",
        parameters=params,
    ).result_rows
    return [(_s(b), int(f), int(n), int(t)) for b, f, n, t in rows]


def read_pieces(
    client: Client,
    database: str,
    size: int,
    batches_of: Mapping[str, Iterable[str]],
    instance: str | None = None,
    old_sizes: Iterable[int] = (),
) -> LogPieces | str:
    """The pieces (sql/008) proofs in the tree of `size` leaves need for the row hashes of
    `batches_of` (row hash -> the batches its ledger rows are in), or why they cannot be
    used (a string: a batch's ledger rows differ from its stored position, a chunk of leaves
    from its stored subtree, a stored node is missing). Reads: the batches' positions, the
    ledger rows of the batches of the chunks they may fall in (one query), the nodes. Row
    hashes not in the tree's first `size` leaves (of `instance`'s log) are absent from
    `index` (None: the store's one log). `old_sizes`: also what consistency proofs from
    trees of those sizes need (LogPieces.consistency); each must be within 0..size."""
    db, k = database, CHUNK_LEVEL
    instance = one_instance(client, db, instance)
    cols = has_instance_columns(client, db)
    mine = instance_filter(cols, instance)
    wanted = sorted({b for bs in batches_of.values() for b in bs})
    by_id = f"ingest_batch IN {{b:Array(String)}} AND {mine}"
    listed = _positions(client, db, by_id, {"b": wanted, "instance": instance}) if wanted else []
    pos = {b: (f, n, t) for b, f, n, t in listed}
    if size == 0:
        return LogPieces(0, {}, {}, {})
    # the chunks the rows' leaves may fall in, and the last: read their batches' ledger rows
    # together with the rows' own batches, in one query
    olds = sorted(set(old_sizes))
    if any(not 0 <= m <= size for m in olds):
        raise ValueError(f"old sizes {olds} are not all within 0..{size}")
    maybe = {(size - 1) >> k} | {(m - 1) >> k for m in olds if 0 < m < size} | {
        c for f, n, _t in pos.values() if n and f < size
        for c in range(f >> k, (min(f + n, size) - 1 >> k) + 1)
    }  # fmt: skip
    ranges = {c: (c << k, min((c + 1) << k, size)) for c in maybe}
    where = " OR ".join(f"(first_leaf < {hi} AND first_leaf + leaves > {lo})"
                        for lo, hi in ranges.values())  # fmt: skip
    more = {
        b: (f, n, t)
        for b, f, n, t in _positions(
            client, db, f"leaves > 0 AND {mine} AND ({where})", {"instance": instance}
        )
    }
    hashes = _batch_hashes(client, db, {**pos, **more})
    if isinstance(hashes, str):
        return hashes
    index: dict[str, int] = {}
    for h, bs in batches_of.items():
        # a ledger row naming a batch of the log must be among that batch's leaves (its
        # receive-time window read it): else the ledger was written to since
        if (b := next((b for b in bs if b in pos and h not in hashes[b]), None)) is not None:
            return f"batch {b}: a ledger row naming it is not among its stored leaves"
        found = [pos[b][0] + bisect_left(hashes[b], h) for b in bs if b in pos and h in hashes[b]]
        if found and min(found) < size:
            index[h] = min(found)
    nodes_needed, chunks = pieces_needed(size, index.values(), chunk_level=k, old_sizes=olds)
    ranges = {c: ranges[c] for c in chunks}
    # a complete chunk is checked against its stored subtree, so rewritten ledger rows show
    full = {c for c, (lo, hi) in ranges.items() if hi - lo == 1 << k}
    keys = sorted(nodes_needed | {(k, c) for c in full})
    nodes = _nodes(client, db, keys, instance)
    if len(nodes) != len(keys):
        return f"{len(keys) - len(nodes)} stored subtree(s) of the log are missing"
    out: dict[int, tuple[bytes, ...]] = {}
    for c, (lo, hi) in ranges.items():
        leaves: list[bytes] = []
        at = lo  # the next leaf to place
        for b, (f, n, _t) in sorted(more.items(), key=lambda kv: kv[1][0]):
            if f < hi and f + n > lo:
                if max(f, lo) != at:
                    return f"the stored positions do not tile leaves {lo}..{hi - 1} (at {at})"
                end = min(f + n, hi)
                leaves += [leaf_hash(log_entry(h)) for h in hashes[b][at - f : end - f]]
                at = end
        if at != hi:
            return f"the stored positions do not cover leaves {lo}..{hi - 1}"
        if c in full and root(leaves) != nodes[(k, c)]:
            return f"the ledger rows of leaves {lo}..{hi - 1} do not match their stored subtree"
        out[c] = tuple(leaves)
    return LogPieces(size, index, nodes, out)


def _batch_hashes(
    client: Client, db: str, pos: Mapping[str, tuple[int, int, int]]
) -> dict[str, list[str]] | str:
    """Each batch's ledger row hashes, sorted; a string when a batch's count differs from its
    stored position. The batches' receive times bound the partitions read."""
    if not pos:
        return {}
    lo = min(t for _f, _n, t in pos.values()) - _WINDOW_MS
    hi = max(t for _f, _n, t in pos.values()) + _WINDOW_MS
    rows = client.query(
        f"""SELECT ingest_batch, arraySort(groupArray(toString(row_hash)))
            FROM {db}.transition_ledger
            WHERE ingest_batch IN {{b:Array(String)}}
              AND ingested_at BETWEEN fromUnixTimestamp64Milli({lo})
                                  AND fromUnixTimestamp64Milli({hi})
            GROUP BY ingest_batch""",
        parameters={"b": sorted(pos)},
    ).result_rows
    out: dict[str, list[str]] = {b: [] for b in pos} | {
        _s(b): [_s(h) for h in hs] for b, hs in rows
    }
    for b, (_f, n, _t) in pos.items():
        if len(out[b]) != n:
            return f"batch {b}: {len(out[b])} ledger rows, its stored position {n} leaves"
    return out


def _nodes(
    client: Client, db: str, keys: Sequence[tuple[int, int]], instance: str = ""
) -> dict[tuple[int, int], bytes]:
    if not keys:
        return {}
    pairs = ", ".join(f"({int(lv)}, {int(i)})" for lv, i in keys)
    mine = instance_filter(has_instance_columns(client, db), instance)
    rows = client.query(
        f"""SELECT level, index, any(hash) FROM {db}.ledger_nodes
            WHERE (level, index) IN ({pairs}) AND {mine} GROUP BY level, index""",
        parameters={"instance": instance},
    ).result_rows
    return {(int(lv), int(i)): h if isinstance(h, bytes) else h.encode("latin-1")
            for lv, i, h in rows}  # fmt: skip
