"""Whether serve may sign on a store: its newest head against the checkpoint serve kept.

serve keeps the checkpoint of the newest head it signed outside the store, beside its
signing key (foundation.checkpoint.checkpoint_path). Someone who can write the stopped store
but not that directory can delete the newest batches together with the heads above them:
the store then agrees with itself, and only the kept checkpoint shows the log went back.
At start the signer compares the two (`decide`, pure) and refuses to sign on when the
store's log does not reach the kept head, unless the operator accepts the rollback
(`--accept-ledger-rollback`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Decision", "StartView", "TreeHead", "decide"]


@dataclass(frozen=True, slots=True)
class TreeHead:
    """A tree size (leaves) and its root hash (32 bytes)."""

    size: int
    root: bytes


@dataclass(frozen=True, slots=True)
class StartView:
    """What the signer sees at start. `kept`: the kept checkpoint (None: no file);
    `newest`: the store's newest signed head of this log (None: none); `root_at_kept`: the
    root of the store's signed log at kept.size (None: the signed log is shorter);
    `accept_rollback`: the operator's flag; `where`: the kept file, for messages."""

    kept: TreeHead | None
    newest: TreeHead | None
    root_at_kept: bytes | None
    accept_rollback: bool = False
    where: str = "the kept checkpoint"


@dataclass(frozen=True, slots=True)
class Decision:
    """`sign`: sign on; `problem`: what is wrong (None: nothing); `message`: the one line
    to log."""

    sign: bool
    problem: str | None
    message: str


def decide(view: StartView) -> Decision:
    """Sign on when there is no kept checkpoint or the store's signed log reaches it with
    the same root; else refuse, or sign on with a warning when the rollback is accepted."""
    kept, newest = view.kept, view.newest
    if kept is None:
        return Decision(True, None, f"no kept checkpoint ({view.where}): nothing to compare")
    have = 0 if newest is None else newest.size
    if view.root_at_kept is None:
        problem = (
            f"the store's newest signed head is at tree size {have}, {view.where} covers "
            f"{kept.size}: leaves {have}..{kept.size - 1} and their heads are gone from the "
            "store (rolled back)"
        )
    elif view.root_at_kept != kept.root:
        problem = (
            f"the store's signed log at tree size {kept.size} has root "
            f"{view.root_at_kept.hex()[:16]}…, {view.where} says {kept.root.hex()[:16]}…: "
            "the store holds another log (a fork, or a store replaced)"
        )
    else:
        return Decision(True, None, f"the store reaches {view.where} (tree size {kept.size})")
    if view.accept_rollback:
        return Decision(
            True,
            problem,
            f"LEDGER ROLLBACK ACCEPTED (--accept-ledger-rollback): {problem}; signing on "
            f"from tree size {have}",
        )
    return Decision(
        False,
        problem,
        f"halted: REFUSING TO SIGN: {problem}; run `handoffs ledger verify --checkpoint` "
        "on it, or restart serve with --accept-ledger-rollback to sign on from the store",
    )
