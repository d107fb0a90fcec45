"""The store's signed ledger logs as evidence packages use them: one per serve instance
(foundation.ledger_instances, sql/010), each with its newest signed head.

`StoreLogs.section` builds a package's `integrity.log` (analytics.evidence._log_proofs): for each
instance whose log holds the handoff's rows, the proofs from the stored pieces of that log
(sql/008: O(log n) rows read), or, when the pieces do not reach its newest head or do not
match the ledger rows they cover, from a full read of that log (`note` says why); then
merged, each entry naming its instance. `StoreLogs.problems` is the store side of verify:
each package head against the store's newest head of its instance (an RFC 9162
consistency proof, assembled from the stored pieces with the fallback above), and each
stored row in some signed log. What the pieces do not cover (ledger rows outside the
chunks read) is `handoffs ledger verify`'s to check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from analytics.evidence._log_proofs import (
    check_consistency,
    consistency_problems,
    log_section,
    log_section_from,
    merge_sections,
)
from foundation.integrity import log_entry
from foundation.ledger_instances import INSTANCE_SQL, has_instance_columns
from foundation.ledger_log import LogPieces, covers, newest_heads, read_leaves, read_pieces
from foundation.merkle import leaf_hash

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from foundation.keys import PublicKeys, SignedHead

__all__ = ["StoreLogs"]

_FULL_READ: Final = "proofs from a full read of the log: "
_NOT_STORED: Final = (
    "the signer's stored pieces of the log (sql/008) do not reach the newest head (signed by "
    "an older serve; a signing serve stores them when it starts)"
)


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _of(instance: str, message: str) -> str:
    """A problem about `instance`'s log: 'log:' becomes 'log of instance X:' when named."""
    return message.replace("log:", f"log of instance {instance}:", 1) if instance else message


class StoreLogs:
    """The store's logs: each instance's newest signed head (read once), whether its stored
    pieces reach it, and its leaves read only when a full read is needed."""

    def __init__(self, client: Client, db: str) -> None:
        self._client, self._db = client, db
        self.heads: dict[str, SignedHead] = newest_heads(client, db)
        self._covers: dict[str, bool] = {}
        self._leaves: dict[str, list[bytes]] = {}
        self.full_reads = 0  # logs read whole (for benchmarks)

    @property
    def head(self) -> SignedHead | None:
        """The newest head of the log '' or, without one, of the first instance."""
        return self.heads.get("") or next(iter(sorted(self.heads.items())), (None, None))[1]

    def covered(self, instance: str) -> bool:
        if instance not in self._covers:
            head = self.heads.get(instance)
            self._covers[instance] = head is not None and covers(self._client, self._db, head)
        return self._covers[instance]

    def leaves(self, instance: str) -> list[bytes]:
        if instance not in self._leaves:
            self._leaves[instance] = read_leaves(self._client, self._db, instance)
            self.full_reads += 1
        return self._leaves[instance]

    def instances_of(self, batches_of: Mapping[str, Sequence[str]]) -> list[str]:
        """The instances with a signed head whose logs hold the batches of `batches_of`
        (row hash -> batches): from the stored positions (an index on the batch id), then
        from ingest_batches for batches no position names; every instance with a head when
        none of them is known."""
        if len(self.heads) <= 1:  # one signed log: nothing to look up
            return sorted(self.heads)
        ids = sorted({b for bs in batches_of.values() for b in bs})
        found: dict[str, str] = {}
        if ids and has_instance_columns(self._client, self._db):
            found = {_s(b): _s(i) for b, i in self._client.query(
                f"SELECT DISTINCT ingest_batch, instance FROM {self._db}.ledger_positions "
                "WHERE ingest_batch IN {b:Array(String)}", parameters={"b": ids}).result_rows}  # fmt: skip
        rest = [b for b in ids if b not in found]
        if rest:
            found |= {_s(b): _s(i) for b, i in self._client.query(
                f"SELECT ingest_batch, {INSTANCE_SQL} FROM {self._db}.ingest_batches "
                "WHERE ingest_batch IN {b:Array(String)}", parameters={"b": rest}).result_rows}  # fmt: skip
        mine = sorted(set(found.values()) & set(self.heads))
        return mine or sorted(self.heads)

    def pieces(
        self, instance: str, batches_of: Mapping[str, Sequence[str]], old_sizes: Sequence[int] = ()
    ) -> LogPieces | str:
        """The stored pieces of `instance`'s log up to its newest head, or why not."""
        head = self.heads[instance]
        if not self.covered(instance):
            return _NOT_STORED
        return read_pieces(
            self._client, self._db, head.tree_size, batches_of, instance, old_sizes=old_sizes
        )

    # ------------------------------------------------------------ packages

    def section(
        self, transitions: Sequence[Mapping[str, Any]], batches_of: Mapping[str, Sequence[str]]
    ) -> dict[str, Any]:
        """`integrity.log` of a package with these transitions (see the module doc)."""
        if not self.heads:
            return log_section([], None, transitions)
        sections = [(i, self._section(i, transitions, batches_of))
                    for i in self.instances_of(batches_of)]  # fmt: skip
        covering = [
            (i, s) for i, s in sections if any(e["index"] is not None for e in s["entries"])
        ]
        return merge_sections(covering or sections[:1], transitions)

    def _section(
        self,
        instance: str,
        transitions: Sequence[Mapping[str, Any]],
        batches_of: Mapping[str, Sequence[str]],
    ) -> dict[str, Any]:
        head = self.heads[instance]
        pieces = self.pieces(instance, batches_of)
        why = pieces if isinstance(pieces, str) else ""
        if not isinstance(pieces, str):
            section = log_section_from(pieces, head, transitions)
            if section["store_matched_head"]:
                return section
            why = "the stored pieces of the log do not reproduce the signed head"
        section = log_section(self.leaves(instance), head, transitions)
        section["note"] = _FULL_READ + why
        return section

    # ------------------------------------------------------------ verify

    def problems(
        self,
        package_heads: Mapping[str, SignedHead],
        stored: Sequence[tuple[str, str]],
        batches_of: Mapping[str, Sequence[str]],
        keys: PublicKeys | None,
    ) -> list[str]:
        """The store side of verify: each package head consistent with the store's newest
        head of its instance, those heads signed by `keys`, and each stored row (span id,
        row hash) in some signed log."""
        problems: list[str] = []
        signed: set[str] = set()
        for inst in sorted(set(package_heads) | set(self.instances_of(batches_of))):
            store_head, mine = self.heads.get(inst), package_heads.get(inst)
            if store_head is None:
                if mine is not None:
                    problems += [_of(inst, p) for p in check_consistency(mine, [], None)]
                continue
            if keys is not None and (err := keys.check(store_head)):
                problems.append(_of(inst, f"log: the store's newest head: {err}"))
            olds = [mine.tree_size] if mine and mine.tree_size <= store_head.tree_size else []
            pieces = self.pieces(inst, batches_of, olds)
            if isinstance(pieces, str):  # the full read of this log
                leaves = self.leaves(inst)
                if mine is not None:
                    problems += [_of(inst, p) for p in check_consistency(mine, leaves, store_head)]
                wanted = {leaf_hash(log_entry(h)): h for _span, h in stored}
                signed |= {wanted[x] for x in leaves[: store_head.tree_size] if x in wanted}
                continue
            root = pieces.root()
            if mine is not None:
                proof = pieces.consistency(mine.tree_size) if olds else []
                found = consistency_problems(mine, store_head, root, proof)
                problems += [_of(inst, p) for p in found]
            elif root.hex() != store_head.root:
                problems.append(_of(inst, f"log: the store's leaves do not reproduce its newest "
                                          f"signed head (size {store_head.tree_size}): the "
                                          "ledger was rewritten"))  # fmt: skip
            signed |= set(pieces.index)
        for span, h in stored:
            if h not in signed:
                problems.append(f"span_id={span}: stored, but in no signed head of the store's log")
        return problems
