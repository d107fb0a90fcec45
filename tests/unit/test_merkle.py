"""foundation.merkle against the Certificate Transparency test vectors (RFC 6962 / RFC 9162
trees are the same) and against the RFC's recursive definitions spelled out here."""

from __future__ import annotations

import hashlib
import random

import pytest

from foundation.merkle import (
    EMPTY_ROOT,
    Frontier,
    Levels,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

# The reference entries of the CT test data, and the root of the tree of the first n.
ENTRIES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243",
           "5051525354555657", "606162636465666768696a6b6c6d6e6f")]  # fmt: skip
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = {
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}  # fmt: skip
CONSISTENCY = {
    (2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}  # fmt: skip
LEAVES = [leaf_hash(e) for e in ENTRIES]


def _hex(xs: list[bytes]) -> list[str]:
    return [x.hex() for x in xs]


# ---- the RFC's definitions, written as plainly as the text (slices, no shortcuts)
def ref_mth(d: list[bytes]) -> bytes:
    n = len(d)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return d[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    n = len(d)
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [ref_mth(d)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return [*ref_subproof(m, d[:k], b), ref_mth(d[k:])]
    return [*ref_subproof(m - k, d[k:], False), ref_mth(d[:k])]


def test_roots_match_the_published_vectors():
    assert EMPTY_ROOT.hex() == ROOTS[0]
    for n in range(len(LEAVES) + 1):
        assert root(LEAVES[:n]).hex() == ROOTS[n], n
        assert Frontier.of(LEAVES[:n]).root().hex() == ROOTS[n], n


def test_proofs_match_the_published_vectors():
    for (i, n), want in INCLUSION.items():
        assert _hex(inclusion_proof(i, LEAVES[:n])) == want
        proof = [bytes.fromhex(p) for p in want]
        assert verify_inclusion(i, n, LEAVES[i], proof, bytes.fromhex(ROOTS[n]))
    for (m, n), want in CONSISTENCY.items():
        assert _hex(consistency_proof(m, LEAVES[:n])) == want
        proof = [bytes.fromhex(p) for p in want]
        assert verify_consistency(m, n, bytes.fromhex(ROOTS[m]), bytes.fromhex(ROOTS[n]), proof)


def test_every_proof_of_every_size_agrees_with_the_definitions_and_verifies():
    leaves = [leaf_hash(i.to_bytes(2, "big")) for i in range(40)]
    roots = [ref_mth(leaves[:n]) for n in range(len(leaves) + 1)]
    frontier = Frontier()
    for n in range(1, len(leaves) + 1):
        frontier = frontier.extend([leaves[n - 1]])
        assert frontier.size == n and frontier.root() == roots[n] == root(leaves[:n])
        levels = Levels.of(leaves[:n])
        assert levels.root() == roots[n]
        for i in range(n):
            p = inclusion_proof(i, leaves[:n])
            assert p == ref_path(i, leaves[:n]) == levels.inclusion_proof(i)
            assert verify_inclusion(i, n, leaves[i], p, roots[n])
            assert not verify_inclusion(i, n, leaves[(i + 1) % n], p, roots[n]) or n == 1
        for m in range(n + 1):
            c = consistency_proof(m, leaves[:n])
            assert c == ([] if m in (0, n) else ref_subproof(m, leaves[:n], True))
            assert verify_consistency(m, n, roots[m], roots[n], c)


def test_mangled_proofs_are_refused():
    rng = random.Random(9162)
    leaves = [leaf_hash(bytes([i])) for i in range(23)]
    for _ in range(300):
        n = rng.randint(2, len(leaves))
        i = rng.randrange(n)
        r = root(leaves[:n])
        p = inclusion_proof(i, leaves[:n])
        assert not verify_inclusion(i, n, leaves[i], p[:-1], r)
        assert not verify_inclusion(i, n, leaves[i], [*p, b"\xab" * 32], r)
        flipped = list(p)
        j = rng.randrange(len(p))
        flipped[j] = bytes([flipped[j][0] ^ 1]) + flipped[j][1:]
        assert not verify_inclusion(i, n, leaves[i], flipped, r)
        assert not verify_inclusion(n, n, leaves[i], p, r)
        m = rng.randint(1, n - 1)
        c = consistency_proof(m, leaves[:n])
        rm = root(leaves[:m])
        assert not verify_consistency(m, n, rm, r, c[:-1])
        assert not verify_consistency(m, n, rm, r, [*c, b"\xcd" * 32])
        assert not verify_consistency(m, n, root(leaves[: m + 1]), r, c) or m + 1 == n
        assert not verify_consistency(n, m, r, rm, c)
        assert not verify_consistency(m, n, rm, r, [])
    assert verify_consistency(4, 4, root(leaves[:4]), root(leaves[:4]), [])
    assert not verify_consistency(4, 4, root(leaves[:4]), root(leaves[:5]), [])
    assert verify_consistency(0, 8, EMPTY_ROOT, root(leaves[:8]), [])


def test_node_and_leaf_hash_prefixes():
    assert leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    assert (
        node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    )
    with pytest.raises(ValueError):
        inclusion_proof(3, LEAVES[:3])
    with pytest.raises(ValueError):
        consistency_proof(4, LEAVES[:3])
