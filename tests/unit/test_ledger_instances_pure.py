"""The pure parts of several serve instances on one store: chains split into logs, log
reports combined, package log sections merged, heads signed with their instance."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from analytics.evidence._log_proofs import merge_sections
from foundation.integrity import GENESIS
from foundation.keys import PublicKeys, SignedHead, sign_head
from foundation.ledger_instances import instance_of, source_with, split_chains
from foundation.ledger_log import LogReport
from ingest._verify import combine_logs


def test_each_chain_is_the_log_of_its_first_batchs_instance():
    rows = [
        ("a1", GENESIS, "ca1", 1, "a"),
        ("b1", GENESIS, "cb1", 2, "b"),
        ("a2", "ca1", "ca2", 3, "a"),
        ("x", "ca2", "cx", 4, ""),  # appended by hand onto a's chain: a's (unsigned) leaf
        ("b2", "cb1", "cb2", 5, "b"),
        ("lost", "gone", "cl", 6, "b"),  # its link removed: unreachable, under its instance
    ]
    ordered, unreachable = split_chains(rows)
    assert ordered == {"a": ["a1", "a2", "x"], "b": ["b1", "b2"]}
    assert unreachable == {"b": ["lost"]}


def test_the_instance_travels_in_the_source():
    assert source_with("otlp-http", "edge-1") == "otlp-http@edge-1"
    assert instance_of("otlp-http@edge-1") == "edge-1"
    assert source_with("file", "") == "file" and instance_of("file") == ""


def test_combined_reports_name_each_instance():
    one = LogReport(3, 1, 3, 0, None, notes=("n",))
    assert combine_logs([("a", one)]) is one  # one log: itself
    bad = LogReport(4, 2, 2, 1, 2, problems=("p",))
    both = combine_logs([("a", one), ("b", bad)])
    assert (both.leaves, both.heads, both.verified_size, both.first_bad) == (7, 3, 5, 2)
    assert both.problems == ("instance b: p",) and both.notes == ("instance a: n",)


def _section(inst: str, covered: list[bool]) -> dict:
    head = {"tree_size": 9, "instance": inst} if inst else {"tree_size": 9}
    return {
        "head": head,
        "entries": [
            {"row_hash": f"{i}", "index": i if c else None, "path": []}
            for i, c in enumerate(covered)
        ],
        "pending": [],
        "store_matched_head": True,
    }


def test_merged_sections_take_each_entry_from_the_log_that_proves_it():
    trs = [{"row_hash": f"{i}", "span_id": f"s{i}"} for i in range(3)]
    single = _section("a", [True, True, True])
    assert merge_sections([("a", single)], trs) == single
    merged = merge_sections(
        [("a", _section("a", [True, False, False])), ("b", _section("b", [False, True, False]))],
        trs,
    )
    assert [e.get("instance") for e in merged["entries"]] == ["a", "b", None]
    assert merged["pending"] == ["s2"] and sorted(merged["heads"]) == ["a", "b"]
    assert merged["head"]["instance"] == "a"


def test_a_head_covers_its_instance_and_the_log_without_one_signs_as_before():
    key = Ed25519PrivateKey.generate()
    keys = PublicKeys.of([key.public_key()])
    kw: dict[str, Any] = {
        "tree_size": 2,
        "root": bytes(32),
        "signed_at": 1,
        "batches": 1,
        "chain_hash": "c",
    }
    named = sign_head(key, instance="edge-1", **kw)
    assert keys.check(named) is None and b'"instance":"edge-1"' in named.message()
    moved = SignedHead(**{**named.as_dict(), "instance": "edge-2"})
    assert "does not verify" in (keys.check(moved) or "")
    plain = sign_head(key, **kw)
    assert b"instance" not in plain.message() and "instance" not in plain.as_dict()
    assert SignedHead.from_dict(named.as_dict()) == named


def test_instance_notes_count_each_instances_proofs():
    from analytics.evidence.verify import instance_notes

    def head(inst: str, size: int) -> dict:
        h = SignedHead(size, "ab" * 32, 1, 1, "c" * 64, "k1", "s", instance=inst)
        return h.as_dict()

    entries = [{"index": 0, "instance": ""}, {"index": 3, "instance": "a"},
               {"index": 4, "instance": "a"}, {"index": None, "path": []}]  # fmt: skip
    section = {"head": head("", 2), "heads": {"": head("", 2), "a": head("a", 5)},
               "entries": entries}  # fmt: skip
    offline = instance_notes(section)
    assert [n.split(":")[0] for n in offline] == ["log of instance (none)", "log of instance a"]
    assert ["1 transition " in offline[0], "2 transitions" in offline[1]] == [True, True]
    assert "size 5 signed by key k1" in offline[1] and "store" not in offline[1]
    stored = instance_notes(section, {"a": 7})
    assert stored[0].endswith("has size none") and stored[1].endswith("has size 7")
    one = {"head": head("", 2), "entries": entries[:1]}  # the one unnamed log: nothing
    assert instance_notes(one) == [] and instance_notes({"heads": []}) == []
    assert instance_notes({"head": head("b", 9), "entries": [{"index": 1}]})[0].startswith(
        "log of instance b: 1 transition"
    )  # one named log: its entries name no instance
