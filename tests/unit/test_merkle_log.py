"""The ledger log's pure parts: chain order, signed heads and keys, the log check, and the
package's inclusion proofs (no store: logs built in memory)."""

from __future__ import annotations

import stat

from analytics.evidence._log_proofs import check_consistency, check_log_section, log_section
from foundation.integrity import GENESIS, batch_hash, chain, chain_order, log_entry
from foundation.keys import PublicKeys, SignedHead, generate_keypair, load_private_key, sign_head
from foundation.ledger_log import LedgerLog, LogBatch, check_log
from foundation.merkle import Frontier, leaf_hash
from handoffs.cli import main


def _hashes(k: int, n: int) -> tuple[str, ...]:
    return tuple(sorted(f"{k:02x}{i:062x}" for i in range(n)))


def _log(sizes: list[int]) -> LedgerLog:
    batches, prev = [], GENESIS
    for k, n in enumerate(sizes):
        hs = _hashes(k, n)
        prev = chain(prev, batch_hash(hs))
        batches.append(LogBatch(f"b{k}", prev, n, hs))
    return LedgerLog(tuple(batches))


def _head(key, log: LedgerLog, batches: int, at: int = 1) -> SignedHead:
    leaves = [leaf_hash(log_entry(h)) for b in log.batches[:batches] for h in b.row_hashes]
    return sign_head(key, tree_size=len(leaves), root=Frontier.of(leaves).root(), signed_at=at,
                     batches=batches, chain_hash=log.batches[batches - 1].chain_hash)  # fmt: skip


def test_chain_order_walks_links_not_times():
    rows = [
        ("c", "l2", "l3", 1),
        ("a", GENESIS, "l1", 3),
        ("b", "l1", "l2", 2),
        ("x", "gone", "l9", 0),
    ]
    assert chain_order(rows) == (["a", "b", "c"], ["x"])
    assert chain_order(rows, start="l1") == (["b", "c"], ["x", "a"])
    # a fork: each branch whole, the earlier-received first
    fork = [
        ("a", GENESIS, "l1", 1),
        ("b2", "l1", "m2", 5),
        ("b1", "l1", "n2", 4),
        ("c", "n2", "n3", 9),
    ]
    assert chain_order(fork)[0] == ["a", "b1", "c", "b2"]


def test_keys_files_heads_and_rotation(tmp_path, capsys):
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 0
    assert "key id" in capsys.readouterr().out
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 2  # never overwrites
    _k, _pub, kid_b = generate_keypair(tmp_path / "b")
    a, b = load_private_key(tmp_path / "k.key"), load_private_key(tmp_path / "b.key")
    log = _log([3, 2])
    ha, hb = _head(a, log, 1), _head(b, log, 2)
    assert hb.key_id == kid_b and SignedHead.from_dict(hb.as_dict()) == hb
    both = PublicKeys.of([a.public_key(), b.public_key()])
    assert both.check(ha) is None and both.check(hb) is None
    only_b = PublicKeys.of([b.public_key()])
    assert "not among the public keys" in (only_b.check(ha) or "")
    forged = SignedHead(**{**hb.as_dict(), "tree_size": 4})
    assert "does not verify" in (both.check(forged) or "")


def test_check_log_names_the_first_bad_position(tmp_path):
    generate_keypair(tmp_path / "k")
    key = load_private_key(tmp_path / "k.key")
    keys = PublicKeys.of([key.public_key()])
    log = _log([3, 2, 4])
    heads = [_head(key, log, 1), _head(key, log, 2), _head(key, log, 3)]
    good = check_log(log, heads, keys)
    assert good.ok and good.verified_size == 9 and good.first_bad is None and good.unsigned == 0
    # a leaf of the second batch rewritten (its batch hash and the chain recomputed)
    hs = list(log.batches[1].row_hashes)
    hs[0] = "f" * 64
    bad = LedgerLog((log.batches[0], LogBatch("b1", "x", 2, tuple(sorted(hs))), log.batches[2]))
    rep = check_log(bad, heads, keys)
    assert not rep.ok and rep.first_bad == 3 and rep.verified_size == 3
    assert any("first bad position at or after leaf 3, batch #1 b1" in p for p in rep.problems)
    # truncated: the last batch gone
    short = LedgerLog(log.batches[:2])
    assert any("was truncated" in p for p in check_log(short, heads, keys).problems)
    # rows stored after the newest head are a note, not a problem
    later = check_log(log, heads[:2], keys)
    assert later.ok and later.unsigned == 4


def test_inclusion_and_consistency_for_a_package(tmp_path):
    generate_keypair(tmp_path / "k")
    key = load_private_key(tmp_path / "k.key")
    keys = PublicKeys.of([key.public_key()])
    log = _log([3, 2, 4])
    entries, leaves = log.entries(), log.leaves()
    old, new = _head(key, log, 2, at=5), _head(key, log, 3, at=6)
    transitions = [{"row_hash": entries[i], "span_id": f"s{i}"} for i in (0, 4, 7)]
    section = log_section(leaves, old, transitions)
    assert [e["index"] for e in section["entries"]] == [0, 4, None] and section["pending"] == ["s7"]
    pkg = {"transitions": transitions, "integrity": {"log": section}}
    problems = check_log_section(pkg, keys, generated_at_ns=10)
    assert problems == [
        "transitions[2] (span_id=s7): not covered by the signed head (no inclusion proof)"
    ]
    assert check_log_section(pkg, keys, generated_at_ns=1)[0].endswith(
        "signed after the package's generated_at"
    )
    assert check_consistency(old, leaves, new) == []
    assert "truncated" in check_consistency(new, leaves, old)[0]
    rewritten = [*leaves[:1], leaf_hash(b"e" * 32), *leaves[2:]]
    assert any("not a prefix" in p for p in check_consistency(old, rewritten, new))
