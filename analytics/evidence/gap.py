"""Rows signed after the fact: the first signed head of a log that covers rows stored while
no serve signed (serve ran without a key, then was restarted with one).

Such rows are proven like any other from then on, but the proof only says the log was
not changed after that head was signed, not after the rows were stored; an auditor should
know which rows that is. Read from the store: the first head of each instance's log
(sql/007, sql/010) and the positions of the batches it covers (sql/008), a batch being
late when it was stored more than `late_after_s` before the head was signed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from analytics.evidence._assemble import iso_ns
from foundation.ledger_instances import has_instance_columns

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["LATE_AFTER_S", "LateSigning", "late_signing", "notes_for", "sentence_of"]

#: a batch stored this long (seconds) before the head covering it was signed was stored
#: while no serve signed (a signing serve signs within --sign-every, 5 s by default)
LATE_AFTER_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class LateSigning:
    """Leaves [0, end_leaf) of `instance`'s log were stored unsigned, the last at
    `stored_until_ns`, and first signed by the head signed at `signed_at_ns`."""

    instance: str
    end_leaf: int
    batches: int
    stored_until_ns: int
    signed_at_ns: int

    def sentence(self) -> str:
        of = f" of instance {self.instance}" if self.instance else ""
        return (
            f"rows{of} stored before {_second_after(self.stored_until_ns)} were signed at "
            f"{iso_ns(self.signed_at_ns)[:19]}Z when serve first ran with a key "
            f"({self.batches} batch{'' if self.batches == 1 else 'es'})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "leaves_before": self.end_leaf,
            "batches": self.batches,
            "stored_before": _second_after(self.stored_until_ns),
            "signed_at": iso_ns(self.signed_at_ns),
        }


def _second_after(t_ns: int) -> str:
    """The whole second after `t_ns`, ISO-8601 UTC: rows stored at t_ns are stored before it."""
    return iso_ns((t_ns // 1_000_000_000 + 1) * 1_000_000_000)[:19] + "Z"


def late_signing(
    client: Client, db: str, *, late_after_s: float = LATE_AFTER_S
) -> list[LateSigning]:
    """Per log whose first signed head covers batches stored more than `late_after_s`
    seconds before it was signed: which. [] for an unsigned store or one signed from the
    start."""
    inst = "instance" if has_instance_columns(client, db) else "''"
    firsts = client.query(
        f"SELECT {inst} AS i, argMin(tree_size, signed_at), toUnixTimestamp64Nano(min(signed_at)) "
        f"FROM {db}.ledger_heads GROUP BY i"
    ).result_rows
    out = []
    for instance, size, signed_ns in firsts:
        if not size:
            continue
        where = f"first_leaf < {int(size)}" + (" AND instance = {i:String}" if inst != "''" else "")
        cut_ms = (int(signed_ns) - int(late_after_s * 1e9)) // 1_000_000
        n, until, end = client.query(
            "SELECT uniqExact(ingest_batch), toUnixTimestamp64Nano(max(received_at)), "
            f"max(first_leaf + leaves) FROM {db}.ledger_positions WHERE {where} "
            f"AND toUnixTimestamp64Milli(received_at) < {cut_ms}",
            parameters={"i": str(instance)},
        ).result_rows[0]
        if n:
            out.append(LateSigning(str(instance), int(end), int(n), int(until), int(signed_ns)))
    return out


def notes_for(pkg: Mapping[str, Any], late: Sequence[LateSigning]) -> list[str]:
    """The sentences of `late` that cover some of the package's transitions, with how many."""
    log = pkg.get("integrity", {}).get("log") or {}
    first = next(iter(log.get("heads") or {}), str((log.get("head") or {}).get("instance", "")))
    notes = []
    for gap in late:
        n = sum(
            1
            for e in log.get("entries") or []
            if e.get("index") is not None
            and str(e.get("instance", first)) == gap.instance
            and int(e["index"]) < gap.end_leaf
        )
        if n:
            notes.append(f"{gap.sentence()}: {n} of this package's transitions")
    return notes


def sentence_of(fact: Mapping[str, Any]) -> str:
    """LateSigning.sentence of its `as_dict` (as a bulk export's manifest keeps it)."""
    n = int(fact.get("batches") or 0)
    of = f" of instance {fact['instance']}" if fact.get("instance") else ""
    return (
        f"rows{of} stored before {fact.get('stored_before')} were signed at "
        f"{str(fact.get('signed_at'))[:19]}Z when serve first ran with a key "
        f"({n} batch{'' if n == 1 else 'es'})"
    )
