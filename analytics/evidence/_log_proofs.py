"""The signed-log part of an evidence package (pure): inclusion proofs of its rows against
a signed head, their check, and the consistency of that head with a newer one.

`integrity.log` of a package:
- `head`: the newest signed head when it was made (foundation.keys.SignedHead as a dict),
  or None when the store has none (serve ran without --signing-key);
- `entries`: one per transition, in the same order: its row hash, its leaf index in the
  log and the RFC 9162 inclusion path (hex), or index None when the head does not cover it;
- `pending`: span ids of transitions no signed head covered yet;
- `store_matched_head`: whether the store's leaves reproduced the head's root at export;
- `note` (only when the proofs came from a full read of the log): why the stored pieces of
  the log (sql/008) could not be used.
With several serve instances on one store (sql/010) each has its own log, and a head names
its `instance` (absent for the log ''). When a package's rows are in the logs of several
instances, each entry also names the `instance` whose log proves it (absent when none
does), `heads` maps each of those instances to its newest signed head and `head` is the
first entry's.

`log_section` builds it from every leaf of the log (O(n)); `log_section_from` from the
pieces a few proofs need (foundation.ledger_log.read_pieces, O(log n)); both give the same
entries for the same store and head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from foundation.integrity import log_entry
from foundation.keys import PublicKeys, SignedHead
from foundation.ledger_log import LogPieces
from foundation.merkle import (
    Levels,
    consistency_proof,
    leaf_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "check_consistency",
    "check_log_section",
    "consistency_problems",
    "log_section",
    "log_section_from",
    "merge_sections",
    "section_heads",
]


def log_section(
    leaves: Sequence[bytes], head: SignedHead | None, transitions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """`integrity.log` for `transitions` (each with row_hash and span_id) given the store's
    log (its Merkle leaf hashes in order, foundation.ledger_log.read_leaves) and its newest
    signed head."""
    if head is None:
        return {
            "head": None,
            "entries": [
                {"row_hash": t["row_hash"], "index": None, "path": []} for t in transitions
            ],
            "pending": [t["span_id"] for t in transitions],
            "store_matched_head": None,
        }
    size = min(head.tree_size, len(leaves))
    levels = Levels.of(leaves[:size])
    matched = size == head.tree_size and levels.root().hex() == head.root
    wanted = {leaf_hash(log_entry(t["row_hash"])): t["row_hash"] for t in transitions}
    first: dict[str, int] = {}
    for i, leaf in enumerate(leaves[:size]):
        h = wanted.get(leaf)
        if h is not None and h not in first:
            first[h] = i
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for t in transitions:
        at = first.get(t["row_hash"])
        if at is None:
            pending.append(t["span_id"])
            out.append({"row_hash": t["row_hash"], "index": None, "path": []})
        else:
            path = [p.hex() for p in levels.inclusion_proof(at)]
            out.append({"row_hash": t["row_hash"], "index": at, "path": path})
    return {
        "head": head.as_dict(),
        "entries": out,
        "pending": pending,
        "store_matched_head": matched,
    }


def log_section_from(
    pieces: LogPieces, head: SignedHead, transitions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """`integrity.log` as log_section gives it, from the stored pieces of the tree of
    `head.tree_size` leaves (pieces.size must be it; ValueError otherwise)."""
    if pieces.size != head.tree_size:
        raise ValueError(f"pieces of a tree of {pieces.size} leaves, the head has {head.tree_size}")
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for t in transitions:
        at = pieces.index.get(t["row_hash"])
        if at is None:
            pending.append(t["span_id"])
            out.append({"row_hash": t["row_hash"], "index": None, "path": []})
        else:
            path = [p.hex() for p in pieces.proof(at)]
            out.append({"row_hash": t["row_hash"], "index": at, "path": path})
    return {
        "head": head.as_dict(),
        "entries": out,
        "pending": pending,
        "store_matched_head": pieces.root().hex() == head.root,
    }


def merge_sections(
    sections: Sequence[tuple[str, Mapping[str, Any]]], transitions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One `integrity.log` from the sections of several instances' logs (each as
    log_section gives it, for the same transitions): each entry from the first log that
    proves it, naming its instance. One section is itself (its head names its instance)."""
    if len(sections) == 1:
        return dict(sections[0][1])
    entries: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, t in enumerate(transitions):
        found = next(((inst, s["entries"][i]) for inst, s in sections
                      if s["entries"][i]["index"] is not None), None)  # fmt: skip
        if found is None:
            pending.append(t["span_id"])
            entries.append({"row_hash": t["row_hash"], "index": None, "path": []})
        else:
            entries.append({**found[1], "instance": found[0]})
    by = dict(sections)
    first = next((e["instance"] for e in entries if "instance" in e), sections[0][0])
    out: dict[str, Any] = {
        "head": by[first]["head"],
        "heads": {inst: s["head"] for inst, s in sections},
        "entries": entries,
        "pending": pending,
        "store_matched_head": all(s["store_matched_head"] for _i, s in sections),
    }
    notes = [f"instance {inst or '(none)'}: {s['note']}" for inst, s in sections if s.get("note")]
    if notes:
        out["note"] = "; ".join(notes)
    return out


def _head(section: Mapping[str, Any]) -> SignedHead | None:
    raw = section.get("head")
    return None if raw is None else SignedHead.from_dict(raw)


def section_heads(section: Mapping[str, Any]) -> dict[str, SignedHead]:
    """The signed heads of `integrity.log` by instance ({} when none); ValueError naming
    the field for a malformed head, or one filed under another instance than its own."""
    raw = section.get("heads")
    if raw is None:
        head = _head(section)
        return {} if head is None else {head.instance: head}
    if not isinstance(raw, Mapping):
        raise ValueError("heads: must be an object of instance -> signed head")
    out = {}
    for inst, h in raw.items():
        try:
            head = SignedHead.from_dict(h)
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"heads[{inst!r}]: {exc}") from None
        if head.instance != inst:
            raise ValueError(f"heads[{inst!r}]: a head of instance {head.instance!r}")
        out[str(inst)] = head
    return out


def check_log_section(
    package: Mapping[str, Any], keys: PublicKeys | None, *, generated_at_ns: int
) -> list[str]:
    """Problems of `integrity.log`: no head, a head not signed by `keys` (not checked when
    None), a transition without a verifying inclusion proof, a head signed after the
    package says it was made."""
    section = package["integrity"].get("log")
    if not isinstance(section, Mapping):
        return ["integrity.log: missing (a package made before the signed log)"]
    try:
        head = _head(section)
    except ValueError as exc:
        return [f"integrity.log.head: {exc}"]
    if head is None:
        return ["integrity.log.head: none (serve signed no head): nothing proves these rows "
                "without the store"]  # fmt: skip
    try:
        heads = section_heads(section)
    except ValueError as exc:
        return [f"integrity.log.{exc}"]
    problems = []
    checked = [("integrity.log.head", head)] + [
        (f"integrity.log.heads[{inst!r}]", h)
        for inst, h in sorted(heads.items())
        if "heads" in section and h != head
    ]
    for where, h in checked:
        if keys is not None and (err := keys.check(h)):
            problems.append(f"{where}: {err}")
        if h.signed_at > generated_at_ns:
            problems.append(f"{where}: signed after the package's generated_at")
    if "heads" in section and heads.get(head.instance) != head:
        problems.append("integrity.log.head: not the head of its instance in integrity.log.heads")
    if section.get("store_matched_head") is not True:
        problems.append("integrity.log.store_matched_head: at export the store's log did not "
                        "reproduce the signed head (the ledger was rewritten)")  # fmt: skip
    entries = section.get("entries")
    transitions = package["transitions"]
    if not isinstance(entries, list) or len(entries) != len(transitions):
        return [*problems, "integrity.log.entries: not one entry per transition"]
    for i, (t, e) in enumerate(zip(transitions, entries, strict=True)):
        where = f"transitions[{i}] (span_id={t.get('span_id')})"
        if not isinstance(e, Mapping) or e.get("row_hash") != t.get("row_hash"):
            problems.append(f"{where}: its log entry is for another row hash")
            continue
        if e.get("index") is None:
            problems.append(f"{where}: not covered by the signed head (no inclusion proof)")
            continue
        of = heads.get(str(e.get("instance", ""))) if "heads" in section else head
        if of is None:
            problems.append(f"{where}: no signed head of its instance {e.get('instance')!r} "
                            "in the package")  # fmt: skip
            continue
        root_b = bytes.fromhex(of.root)
        try:
            path = [bytes.fromhex(p) for p in e["path"]]
            ok = verify_inclusion(
                int(e["index"]), of.tree_size, leaf_hash(log_entry(t["row_hash"])), path, root_b
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            problems.append(f"{where}: its inclusion proof does not verify against the signed "
                            "head (row or proof altered)")  # fmt: skip
    return problems


def check_consistency(
    package_head: SignedHead, store_leaves: Sequence[bytes], store_head: SignedHead | None
) -> list[str]:
    """Problems between the package's head and the store's newest head: the store must hold
    a head at least as large whose tree the package's is a prefix of (RFC 9162 consistency
    proof over the store's leaves), and the store's leaves must reproduce its head."""
    early = _sizes(package_head, store_head)
    if early is not None or store_head is None:
        return early or []
    n = store_head.tree_size
    if len(store_leaves) < n:
        return [f"log: the store holds {len(store_leaves)} leaves, its newest head signed {n} "
                "(the log was truncated)"]  # fmt: skip
    leaves = store_leaves[:n]
    return consistency_problems(
        package_head, store_head, root(leaves), consistency_proof(package_head.tree_size, leaves)
    )


def _sizes(package_head: SignedHead, store_head: SignedHead | None) -> list[str] | None:
    m = package_head.tree_size
    if store_head is None:
        return [f"log: the store has no signed head, the package one of size {m} (heads deleted)"]
    n = store_head.tree_size
    if n < m:
        return [f"log: the store's newest signed head has {n} leaves, the package's {m} "
                "(the log was truncated or its heads deleted)"]  # fmt: skip
    return None


def consistency_problems(
    package_head: SignedHead, store_head: SignedHead | None, store_root: bytes, proof: list[bytes]
) -> list[str]:
    """check_consistency given the root the store's leaves (or its stored pieces) give for
    the store head's size and the consistency proof from the package head's size (pure)."""
    early = _sizes(package_head, store_head)
    if early is not None or store_head is None:
        return early or []
    m, n = package_head.tree_size, store_head.tree_size
    problems = []
    if store_root.hex() != store_head.root:
        problems.append(f"log: the store's leaves do not reproduce its newest signed head "
                        f"(size {n}): the ledger was rewritten")  # fmt: skip
    if not verify_consistency(
        m, n, bytes.fromhex(package_head.root), bytes.fromhex(store_head.root), proof
    ):
        problems.append(f"log: the package's signed head (size {m}) is not a prefix of the "
                        f"store's newest (size {n}): the log was rewritten since")  # fmt: skip
    return problems
