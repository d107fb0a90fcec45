"""The Merkle tree of RFC 9162 §2.1 (Certificate Transparency v2), as pure functions over bytes.

A tree over n leaf hashes (each `leaf_hash(entry)`, 32 bytes) has the root MTH: the
SHA-256 of the empty string for n = 0, the leaf hash for n = 1, else
node_hash(MTH(D[0:k]), MTH(D[k:n])) with k the largest power of two below n. Inclusion
proofs (§2.1.3) show a leaf is in a tree of size n; consistency proofs (§2.1.4) show a tree
of size m is a prefix of a tree of size n (the log only grew). The verifiers follow the
RFC's algorithms step by step; the generators follow its recursive definitions (PATH and
PROOF). Cost: root, proofs O(n) hashes; verifiers O(log n). `Frontier` keeps the
O(log n) perfect subtrees of an append-only tree, so appending leaves and reading the root
cost O(log n) each instead of rehashing the whole tree.

A log too large to hash per proof is stored in pieces: the hashes of its complete aligned
subtrees of 2^j leaves, j >= a chunk level K (subtree x of level j covers leaves
[x 2^j, (x+1) 2^j)), and its leaves, read one chunk of 2^K at a time. `inclusion_proof_from`
and `root_from` assemble the same PATH and MTH from those pieces: O(log n) stored nodes and
at most two chunks of leaves (the leaf's own and the ragged last one). `Frontier.extend_nodes`
yields the subtrees to store as the tree grows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "EMPTY_ROOT",
    "Frontier",
    "Levels",
    "consistency_proof",
    "consistency_proof_from",
    "inclusion_proof",
    "inclusion_proof_from",
    "leaf_hash",
    "node_hash",
    "pieces_needed",
    "root",
    "root_from",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()


def leaf_hash(entry: bytes) -> bytes:
    """SHA-256(0x00 || entry)."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH over the leaf hashes `leaves` (already leaf_hash'ed), 32 bytes."""
    return Frontier.of(leaves).root()


def _mth(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    n = hi - lo
    if n == 1:
        return leaves[lo]
    k = _split(n)
    return node_hash(_mth(leaves, lo, lo + k), _mth(leaves, lo + k, hi))


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, leaves): the audit path of leaf `index` in the tree over all of `leaves`.

    ValueError unless 0 <= index < len(leaves)."""
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError(f"leaf index {index} is outside a tree of {n} leaves")
    out: list[bytes] = []

    def path(m: int, lo: int, hi: int) -> None:
        if hi - lo == 1:
            return
        k = _split(hi - lo)
        if m < k:
            path(m, lo, lo + k)
            out.append(_mth(leaves, lo + k, hi))
        else:
            path(m - k, lo + k, hi)
            out.append(_mth(leaves, lo, lo + k))

    path(index, 0, n)
    return out


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, leaves): proves the tree of the first `old_size` leaves is a prefix of
    the tree over all of `leaves`. Empty for old_size 0 or len(leaves). ValueError unless
    0 <= old_size <= len(leaves)."""
    n = len(leaves)
    if not 0 <= old_size <= n:
        raise ValueError(f"old size {old_size} is outside 0..{n}")
    if old_size in (0, n):
        return []
    out: list[bytes] = []

    def subproof(m: int, lo: int, hi: int, whole: bool) -> None:
        size = hi - lo
        if m == size:
            if not whole:
                out.append(_mth(leaves, lo, hi))
            return
        k = _split(size)
        if m <= k:
            subproof(m, lo, lo + k, whole)
            out.append(_mth(leaves, lo + k, hi))
        else:
            subproof(m - k, lo + k, hi, False)
            out.append(_mth(leaves, lo, lo + k))

    subproof(old_size, 0, n, True)
    return out


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], expected_root: bytes
) -> bool:
    """RFC 9162 §2.1.3.2: True when `proof` shows leaf hash `leaf` at `index` in the tree of
    `size` leaves whose root is `expected_root`. Never raises on bad input."""
    if not 0 <= index < size or any(len(p) != HASH_SIZE for p in proof):
        return False
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == expected_root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: True when `proof` shows the tree (old_size, old_root) is a prefix
    of the tree (new_size, new_root). Equal sizes need an empty proof and equal roots; old
    size 0 is a prefix of everything (empty proof). Never raises on bad input."""
    if not 0 <= old_size <= new_size or any(len(p) != HASH_SIZE for p in proof):
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


@dataclass(frozen=True, slots=True)
class Frontier:
    """An append-only tree's perfect subtrees, largest first: (height, hash) pairs.

    `size` leaves; `extend` returns a new Frontier (this one is unchanged)."""

    size: int = 0
    nodes: tuple[tuple[int, bytes], ...] = ()

    @classmethod
    def of(cls, leaves: Iterable[bytes]) -> Frontier:
        return cls().extend(leaves)

    def extend(self, leaves: Iterable[bytes]) -> Frontier:
        stack = list(self.nodes)
        size = self.size
        for leaf in leaves:
            h, node = 0, leaf
            while stack and stack[-1][0] == h:
                node = node_hash(stack.pop()[1], node)
                h += 1
            stack.append((h, node))
            size += 1
        return Frontier(size, tuple(stack))

    def extend_nodes(
        self, leaves: Iterable[bytes], min_level: int
    ) -> tuple[Frontier, list[tuple[int, int, bytes]]]:
        """`extend(leaves)` and the complete aligned subtrees of level >= `min_level` it
        completes, as (level, index, hash) in the order they complete: what a chunked store
        of the tree holds (subtree `index` of `level` covers leaves index 2^level on)."""
        stack = list(self.nodes)
        size = self.size
        made: list[tuple[int, int, bytes]] = []
        for leaf in leaves:
            h, node = 0, leaf
            size += 1
            if min_level <= 0:
                made.append((0, size - 1, leaf))
            while stack and stack[-1][0] == h:
                node = node_hash(stack.pop()[1], node)
                h += 1
                if h >= min_level:
                    made.append((h, (size >> h) - 1, node))
            stack.append((h, node))
        return Frontier(size, tuple(stack)), made

    def root(self) -> bytes:
        """MTH of the `size` leaves (EMPTY_ROOT when none): the subtrees folded right to left,
        which is the RFC's split at the largest power of two, level by level."""
        if not self.nodes:
            return EMPTY_ROOT
        r = self.nodes[-1][1]
        for _h, node in reversed(self.nodes[:-1]):
            r = node_hash(node, r)
        return r


@dataclass(frozen=True, slots=True)
class Levels:
    """Every level of the tree over `leaves` (level 0 the leaves, a lone last node carried up
    unchanged, which is the RFC's left-full tree): O(n) hashes once, then each inclusion
    proof in O(log n). For many proofs against one tree (an evidence package)."""

    levels: tuple[tuple[bytes, ...], ...]

    @classmethod
    def of(cls, leaves: Sequence[bytes]) -> Levels:
        level = tuple(leaves)
        out = [level]
        while len(level) > 1:
            nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = tuple(nxt)
            out.append(level)
        return cls(tuple(out))

    @property
    def size(self) -> int:
        return len(self.levels[0])

    def root(self) -> bytes:
        return self.levels[-1][0] if self.size else EMPTY_ROOT

    def inclusion_proof(self, index: int) -> list[bytes]:
        """Equal to inclusion_proof(index, leaves). ValueError outside 0..size-1."""
        if not 0 <= index < self.size:
            raise ValueError(f"leaf index {index} is outside a tree of {self.size} leaves")
        out = []
        i = index
        for level in self.levels[:-1]:
            sib = i ^ 1
            if sib < len(level):
                out.append(level[sib])
            i >>= 1
        return out


#: get_subtree_hash(level, index): the stored hash of complete aligned subtree `index` of
#: `level` (>= the chunk level); chunk_leaves(chunk): the leaf hashes of chunk `chunk`
#: (2^K leaves, fewer only for the tree's last chunk, cut at its size)
SubtreeHash = Callable[[int, int], bytes]
ChunkLeaves = Callable[[int], Sequence[bytes]]


@dataclass(frozen=True, slots=True)
class _Pieces:
    size: int
    chunk_level: int
    node: SubtreeHash
    chunk: ChunkLeaves

    def leaves(self, c: int) -> Sequence[bytes]:
        got = self.chunk(c)
        want = min(1 << self.chunk_level, self.size - (c << self.chunk_level))
        if len(got) < want:
            raise ValueError(f"chunk {c} has {len(got)} leaves, the tree needs {want}")
        return got

    def mth(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for a range the RFC's recursion visits (lo aligned to the largest
        power of two at most hi - lo)."""
        n = hi - lo
        k = self.chunk_level
        if n & (n - 1) == 0 and lo % n == 0:  # complete and aligned
            j = n.bit_length() - 1
            if j >= k:
                return self.node(j, lo >> j)
            c = lo >> k
            return _mth(self.leaves(c), lo - (c << k), hi - (c << k))
        if hi - (lo >> k << k) <= 1 << k:  # within one chunk: hash its leaves
            c = lo >> k
            return _mth(self.leaves(c), lo - (c << k), hi - (c << k))
        s = _split(n)
        return node_hash(self.mth(lo, lo + s), self.mth(lo + s, hi))


def _check_level(chunk_level: int) -> None:
    if chunk_level < 0:
        raise ValueError(f"chunk level {chunk_level} is negative")


def root_from(
    size: int, get_subtree_hash: SubtreeHash, chunk_leaves: ChunkLeaves, *, chunk_level: int
) -> bytes:
    """MTH of a tree of `size` leaves from its stored pieces (see SubtreeHash): equal to
    root(leaves[:size]). O(log size) stored nodes and the last chunk's leaves (at most
    2^chunk_level). ValueError for a negative size or chunk level, or a chunk short of
    leaves."""
    _check_level(chunk_level)
    if size < 0:
        raise ValueError(f"tree size {size} is negative")
    if size == 0:
        return EMPTY_ROOT
    return _Pieces(size, chunk_level, get_subtree_hash, chunk_leaves).mth(0, size)


def inclusion_proof_from(
    size: int,
    index: int,
    get_subtree_hash: SubtreeHash,
    chunk_leaves: ChunkLeaves,
    *,
    chunk_level: int,
) -> list[bytes]:
    """PATH(index) in the tree of `size` leaves from its stored pieces (see SubtreeHash):
    equal to inclusion_proof(index, leaves[:size]). O(log size) stored nodes, the leaves of
    `index`'s chunk and of the last chunk. ValueError unless 0 <= index < size, or for a
    chunk short of leaves."""
    _check_level(chunk_level)
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is outside a tree of {size} leaves")
    pieces = _Pieces(size, chunk_level, get_subtree_hash, chunk_leaves)
    out: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            out.append(pieces.mth(lo + k, hi))
            hi = lo + k
        else:
            out.append(pieces.mth(lo, lo + k))
            lo += k
    out.reverse()  # PATH lists the siblings from the leaf up
    return out


def consistency_proof_from(
    old_size: int,
    size: int,
    get_subtree_hash: SubtreeHash,
    chunk_leaves: ChunkLeaves,
    *,
    chunk_level: int,
) -> list[bytes]:
    """PROOF(old_size) in the tree of `size` leaves from its stored pieces (see SubtreeHash):
    equal to consistency_proof(old_size, leaves[:size]). O(log size) stored nodes and the
    leaves of the chunks holding leaf old_size - 1 and the last leaf. ValueError unless
    0 <= old_size <= size, or for a chunk short of leaves."""
    _check_level(chunk_level)
    if not 0 <= old_size <= size:
        raise ValueError(f"old size {old_size} is outside 0..{size}")
    if old_size in (0, size):
        return []
    pieces = _Pieces(size, chunk_level, get_subtree_hash, chunk_leaves)
    out: list[bytes] = []
    m, lo, hi, whole = old_size, 0, size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            out.append(pieces.mth(lo + k, hi))
            hi = lo + k
        else:
            out.append(pieces.mth(lo, lo + k))
            m, lo, whole = m - k, lo + k, False
    if not whole:
        out.append(pieces.mth(lo, hi))
    out.reverse()  # PROOF lists the nodes from the old tree's edge up
    return out


def _need(lo: int, hi: int, k: int, nodes: set[tuple[int, int]], chunks: set[int]) -> None:
    """The pieces _Pieces.mth(lo, hi) reads (same recursion, no hashing)."""
    n = hi - lo
    if n & (n - 1) == 0 and lo % n == 0 and n.bit_length() - 1 >= k:
        nodes.add((n.bit_length() - 1, lo >> n.bit_length() - 1))
    elif (n & (n - 1) == 0 and lo % n == 0) or hi - (lo >> k << k) <= 1 << k:
        chunks.add(lo >> k)
    else:
        s = _split(n)
        _need(lo, lo + s, k, nodes, chunks)
        _need(lo + s, hi, k, nodes, chunks)


def pieces_needed(
    size: int, indexes: Iterable[int], *, chunk_level: int, old_sizes: Iterable[int] = ()
) -> tuple[frozenset[tuple[int, int]], frozenset[int]]:
    """The stored subtrees (level, index) and the chunks whose leaves `root_from(size)`,
    `inclusion_proof_from(size, i)` for each i of `indexes` and `consistency_proof_from(m,
    size)` for each m of `old_sizes` read, so a store can fetch them in one query each:
    O(log size) subtrees and at most 1 + len(indexes) + len(old_sizes) chunks. ValueError as
    those functions."""
    _check_level(chunk_level)
    nodes: set[tuple[int, int]] = set()
    chunks: set[int] = set()
    if size > 0:
        _need(0, size, chunk_level, nodes, chunks)
    for m in old_sizes:
        if not 0 <= m <= size:
            raise ValueError(f"old size {m} is outside 0..{size}")
        if m in (0, size):
            continue
        lo, hi, whole = 0, size, True
        while m != hi - lo:
            k = _split(hi - lo)
            if m <= k:
                _need(lo + k, hi, chunk_level, nodes, chunks)
                hi = lo + k
            else:
                _need(lo, lo + k, chunk_level, nodes, chunks)
                m, lo, whole = m - k, lo + k, False
        if not whole:
            _need(lo, hi, chunk_level, nodes, chunks)
    for index in indexes:
        if not 0 <= index < size:
            raise ValueError(f"leaf index {index} is outside a tree of {size} leaves")
        lo, hi = 0, size
        while hi - lo > 1:
            k = _split(hi - lo)
            if index < lo + k:
                _need(lo + k, hi, chunk_level, nodes, chunks)
                hi = lo + k
            else:
                _need(lo, lo + k, chunk_level, nodes, chunks)
                lo += k
        if size == 1:
            chunks.add(0)
    return frozenset(nodes), frozenset(chunks)
