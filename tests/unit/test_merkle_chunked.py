"""foundation.merkle's chunked assembly (inclusion_proof_from, root_from, extend_nodes)
against the full tree (Levels): every shape of a tree stored as aligned subtrees above a
chunk level and its leaves read one chunk at a time."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.merkle import (
    EMPTY_ROOT,
    Frontier,
    Levels,
    consistency_proof,
    consistency_proof_from,
    inclusion_proof_from,
    leaf_hash,
    pieces_needed,
    root,
    root_from,
    verify_inclusion,
)


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(hashlib.sha256(i.to_bytes(8, "big")).digest()) for i in range(n)]


class _Store:
    """The pieces a chunked store holds for `leaves`, counting what a proof reads."""

    def __init__(self, leaves: list[bytes], k: int) -> None:
        self.k = k
        self.leaves = leaves
        _f, made = Frontier().extend_nodes(leaves, k)
        self.nodes = {(lvl, i): h for lvl, i, h in made}
        self.node_reads = 0
        self.chunks_read: set[int] = set()

    def node(self, level: int, index: int) -> bytes:
        self.node_reads += 1
        return self.nodes[(level, index)]

    def chunk(self, c: int) -> list[bytes]:
        self.chunks_read.add(c)
        return self.leaves[c << self.k : (c + 1) << self.k]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(1, 3000), st.integers(0, 4), st.data())
def test_proofs_from_the_chunked_store_equal_the_full_tree(n, k, data):
    leaves = _leaves(n)
    store = _Store(leaves, k)
    levels = Levels.of(leaves)
    i = data.draw(st.integers(0, n - 1))
    proof = inclusion_proof_from(n, i, store.node, store.chunk, chunk_level=k)
    assert proof == levels.inclusion_proof(i)
    assert verify_inclusion(i, n, leaves[i], proof, levels.root())
    # O(log n) nodes, the leaf's chunk and at most the last one
    assert store.node_reads <= 2 * n.bit_length()
    assert store.chunks_read <= {i >> k, (n - 1) >> k}
    # pieces_needed names (at least) what the proof and the root read
    before = set(store.nodes)
    assert root_from(n, store.node, store.chunk, chunk_level=k) == levels.root()
    nodes, chunks = pieces_needed(n, [i], chunk_level=k)
    fetched = _Store(leaves, k)
    fetched.nodes = {p: h for p, h in store.nodes.items() if p in nodes}
    fetched.leaves = [h if (j >> k) in chunks else b"" for j, h in enumerate(leaves)]
    assert inclusion_proof_from(n, i, fetched.node, fetched.chunk, chunk_level=k) == proof
    assert root_from(n, fetched.node, fetched.chunk, chunk_level=k) == levels.root()
    assert chunks <= {i >> k, (n - 1) >> k} and set(nodes) <= before


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 3000), st.integers(0, 4), st.data())
def test_proofs_of_a_prefix_use_the_nodes_of_the_larger_tree(n, k, data):
    """A head older than the store's newest: its tree is a prefix, the stored nodes of the
    larger tree serve it (only nodes inside the prefix are read)."""
    m = data.draw(st.integers(0, n))
    leaves = _leaves(n)
    store = _Store(leaves, k)
    assert root_from(m, store.node, store.chunk, chunk_level=k) == root(leaves[:m])
    if m:
        i = data.draw(st.integers(0, m - 1))
        got = inclusion_proof_from(m, i, store.node, store.chunk, chunk_level=k)
        assert got == Levels.of(leaves[:m]).inclusion_proof(i)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 3000), st.integers(0, 4), st.data())
def test_consistency_proofs_from_the_chunked_store_equal_the_full_tree(n, k, data):
    m = data.draw(st.integers(0, n))
    leaves = _leaves(n)
    store = _Store(leaves, k)
    got = consistency_proof_from(m, n, store.node, store.chunk, chunk_level=k)
    assert got == consistency_proof(m, leaves)
    assert store.node_reads <= 2 * max(n.bit_length(), 1)
    assert store.chunks_read <= {(m - 1) >> k, (n - 1) >> k}
    nodes, chunks = pieces_needed(n, [], chunk_level=k, old_sizes=[m])
    fetched = _Store(leaves, k)
    fetched.nodes = {p: h for p, h in store.nodes.items() if p in nodes}
    fetched.leaves = [h if (j >> k) in chunks else b"" for j, h in enumerate(leaves)]
    assert consistency_proof_from(m, n, fetched.node, fetched.chunk, chunk_level=k) == got


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 300), max_size=8), st.integers(0, 4))
def test_extend_nodes_in_steps_equals_one_step_and_extend(steps, k):
    leaves = _leaves(sum(steps))
    f, made, at = Frontier(), [], 0
    for s in steps:
        f, m = f.extend_nodes(leaves[at : at + s], k)
        made += m
        at += s
    whole, once = Frontier().extend_nodes(leaves, k)
    assert f == whole == Frontier.of(leaves)
    assert made == once
    # exactly the complete aligned subtrees of level >= k, each once
    want = {(j, x) for j in range(k, 13) for x in range(len(leaves) >> j)}
    assert [(j, x) for j, x, _h in made] == sorted(want, key=lambda p: ((p[1] + 1) << p[0], p[0]))
    for j, x, h in made:
        assert h == root(leaves[x << j : (x + 1) << j])


def test_the_root_of_nothing_and_the_refusals():
    store = _Store(_leaves(5), 1)
    assert root_from(0, store.node, store.chunk, chunk_level=1) == EMPTY_ROOT
    with pytest.raises(ValueError, match="outside"):
        inclusion_proof_from(5, 5, store.node, store.chunk, chunk_level=1)
    with pytest.raises(ValueError, match="negative"):
        root_from(5, store.node, store.chunk, chunk_level=-1)
    with pytest.raises(ValueError, match="leaves"):
        root_from(5, store.node, lambda c: [], chunk_level=1)
    with pytest.raises(ValueError, match="outside"):
        consistency_proof_from(6, 5, store.node, store.chunk, chunk_level=1)
    with pytest.raises(ValueError, match="outside"):
        pieces_needed(5, [], chunk_level=1, old_sizes=[6])
