"""serve's signer thread: extends the ledger log and signs its tree heads (sql/007).

At most every `every_s` seconds, when batches were stored since the last head, the signer
reads the new batches in chain order (foundation.integrity.chain_order), appends their
ledger row hashes to the tree as leaves (hashed by the store; foundation.merkle.Frontier:
O(log n) per leaf, the tree is never rehashed) and writes one Ed25519-signed head to `ledger_heads`. A batch is taken only
once all its ledger rows are visible (the writer stores data before chain rows).

It never signs a log that does not extend what it signed: at start it rebuilds the tree up
to the newest head in the store (one read of the whole log) and compares roots and chain
link; then each tick reads only the batches chained after its last one (received within
the hour before it or later), and the batch of its newest head must stay in the store.
When a check fails it stops signing, logs why once, and says so in `state` (`handoffs
ledger verify` names the place). Ledger rows rewritten below the newest head while serve
runs are found by `handoffs ledger verify`, not by the signer. Batches found at start
after the newest head were stored while no signer ran: it signs them and says how many.
Errors of the store are logged and retried at the next tick; the thread never dies.

With each head it also stores the log in pieces (sql/008_ledger_nodes.sql), before the head
itself: the position of every batch it took and the hash of every complete aligned subtree
of 2^CHUNK_LEVEL leaves or more the new leaves completed, so a package's proofs read
O(log n) rows (foundation.ledger_log.read_pieces). At start it stores the pieces of the
signed log that are missing (a store signed by an older serve), from the read it makes
anyway. Writing a piece twice is harmless (ReplacingMergeTree); it checks before writing.

Each serve instance signs its own log (foundation.ledger_instances, sql/010): the signer of
instance `instance` walks only its own log's chain links (from GENESIS, its batches and
those of no instance: foundation.ledger_instances.log_links), its own heads and pieces, and signs heads naming the instance, so serves sharing a store
never sign, or assign positions in, each other's logs.

With `checkpoint_file` it keeps the checkpoint of each head it signs outside the store
(foundation.checkpoint: a C2SP signed note, written after the head is stored), and at start
compares the store's newest head with it (serve._rollback.decide): a store whose signed log
no longer reaches the kept checkpoint was rolled back, and the signer refuses to sign on
(`state` says why) unless `accept_rollback`, when it signs on with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from foundation import settings
from foundation.checkpoint import (
    CheckpointError,
    Verifier,
    checkpoint_of,
    log_origin,
    parse_checkpoint,
    parse_note,
    sign_note,
    verify_note,
    write_checkpoint,
)
from foundation.integrity import GENESIS, chain_order
from foundation.keys import sign_head
from foundation.ledger_instances import INSTANCE_SQL, log_links
from foundation.ledger_log import CHUNK_LEVEL, read_heads
from foundation.merkle import Frontier
from foundation.store import insert_rows
from serve._rollback import StartView, TreeHead, decide

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from foundation.keys import SignedHead

__all__ = ["SIGNING_KEY", "SIGN_EVERY_S", "Signer"]

log = logging.getLogger("handoffs.serve.signer")

#: batch id -> (chain_hash, transitions, received_at ns), as Signer._batches reads them
_BatchInfo = dict[str, tuple[str, int, int]]
#: batch id -> its Merkle leaves, as Signer._leaves reads them
_Leaves = dict[str, list[bytes]]
#: (level, index, hash) of the stored subtrees (foundation.merkle.Frontier.extend_nodes)
_Nodes = list[tuple[int, int, bytes]]

SIGNING_KEY: Final = settings.SIGNING_KEY
#: a tick reads the batches received from an hour before the last signed one on: requests
#: written concurrently may store a later batch with an earlier receive time
_WINDOW_MS: Final = 3_600_000
#: more batch ids than this are read in one pass over the ledger, not as an IN list (a store
#: signed for the first time may hold millions)
_IDS_PER_QUERY: Final = 5_000
#: ticks the next batch may lack ledger rows before the signer says so
_WARN_AFTER_TICKS: Final = 12

SIGN_EVERY_S: Final = settings.SIGN_EVERY_S


def _time_text(ns: int, digits: int) -> str:
    """A UTC time in ns as DateTime64(`digits`) text (TabSeparated rows, foundation.store)."""
    sec, frac = divmod(ns, 10**9)
    text = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{frac // 10 ** (9 - digits):0{digits}d}"


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Signer:
    """The signer thread; `start()`, `stop()`, `state` ("signing" or why it stopped)."""

    def __init__(
        self,
        connect: Callable[[], Client],
        database: str,
        key: Ed25519PrivateKey,
        *,
        every_s: float = 5.0,
        clock: Callable[[], int] = time.time_ns,
        instance: str = "",
        checkpoint_file: Path | None = None,
        accept_rollback: bool = False,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self.instance = instance
        self.origin = log_origin(instance, database)
        self._kept_file = checkpoint_file
        self._accept_rollback = accept_rollback
        self._on_state = on_state
        self._kept: TreeHead | None = None  # what the kept file holds
        self._connect = connect
        self._db = database
        self._key = key
        self._every = every_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-signer", daemon=True)
        self._client: Client | None = None
        self._frontier = Frontier()
        self._batches_signed = 0  # batches in the tree
        self._chain_hash = GENESIS  # the chain link of the last batch in the tree
        self._received_ns: int | None = None  # when it was received (None: read all)
        self._loaded = False
        self.state = "signing"
        self.heads_signed = 0
        self._waits = 0  # ticks in a row the next batch lacked ledger rows

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Sign what is stored (one last tick), then stop."""
        self._stop.set()
        self._thread.join(timeout)
        if self._client is not None:
            self._client.close()

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self.tick()
            except Exception as exc:  # the store failing: retried at the next tick
                log.warning("signer: %s", str(exc).splitlines()[0][:300] if str(exc) else exc)
                self._client = None
            if stopping:
                return
            self._stop.wait(self._every)

    def _db_client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _batches(self, client: Client, since_ns: int | None) -> tuple[list[str], _BatchInfo]:
        """Batch ids after the signed chain link, in chain order, and id -> (chain_hash,
        transitions, received_at ns). `since_ns`: read only batches received from then on
        (None: all), so a tick reads what is new, not the whole table."""
        where = (
            ""
            if since_ns is None
            else f"AND received_at >= fromUnixTimestamp64Milli({since_ns // 10**6 - _WINDOW_MS})"
        )
        rows = client.query(
            f"""SELECT ingest_batch, prev_chain_hash, chain_hash,
                       toUnixTimestamp64Nano(toDateTime64(received_at, 9)), transitions,
                       {INSTANCE_SQL}
                FROM {self._db}.ingest_batches WHERE 1 {where}"""
        ).result_rows
        info = {_s(b): (_s(c), int(n), int(t)) for b, _p, c, t, n, _i in rows}
        links = log_links(
            [(_s(b), _s(p), _s(c), int(t), _s(i)) for b, p, c, t, _n, i in rows], self.instance
        )
        ordered, _unreachable = chain_order(links, start=self._chain_hash)
        return ordered, info

    def _leaves(self, client: Client, batch_ids: list[str], since_ns: int | None = None) -> _Leaves:
        """Each batch's Merkle leaves: foundation.merkle.leaf_hash of the log entry of each
        of its ledger row hashes, in row-hash order; hashed by the store (SHA256 of 0x00 ||
        the 32 bytes), not by Python. `since_ns`: the batches were received from then on
        (ledger rows carry their batch's receive time), so older partitions and parts are
        skipped."""
        if not batch_ids:
            return {}
        leaves = "arrayMap(h -> SHA256(concat(char(0), unhex(h))), arraySort(groupArray(row_hash)))"
        window = (
            ""
            if since_ns is None
            else f" AND ingested_at >= fromUnixTimestamp64Milli({since_ns // 10**6 - _WINDOW_MS})"
        )
        if len(batch_ids) > _IDS_PER_QUERY:  # many (a first signing): one pass over the table
            wanted = set(batch_ids)
            rows = client.query(
                f"""SELECT ingest_batch, {leaves}
                    FROM {self._db}.transition_ledger GROUP BY ingest_batch"""
            ).result_rows
            return {_s(b): list(hs) for b, hs in rows if _s(b) in wanted}
        rows = client.query(
            f"""SELECT ingest_batch, {leaves}
                FROM {self._db}.transition_ledger
                WHERE ingest_batch IN {{b:Array(String)}}{window}
                GROUP BY ingest_batch""",
            parameters={"b": batch_ids},
        ).result_rows
        return {_s(b): list(hs) for b, hs in rows}

    def _halt(self, why: str) -> None:
        self.state = why
        log.error("signer: %s", why)
        if self._on_state is not None:
            self._on_state(why)

    def _read_kept(self) -> TreeHead | None:
        """The kept checkpoint's head (None: no file); halts on a file altered or of
        another log, unless accept_rollback."""
        if self._kept_file is None:
            return None
        try:
            data = self._kept_file.read_bytes()
            note = parse_note(data)
            mine = Verifier(self.origin, self._key.public_key())
            if any((s.name, s.key_hash) == (mine.name, mine.key_hash) for s in note.signatures):
                verify_note(data, [mine])  # else signed by a key since rotated
            cp = parse_checkpoint(note.text)
            if cp.origin != self.origin:
                raise CheckpointError(f"it is a checkpoint of log {cp.origin}")
        except FileNotFoundError:
            return None
        except (OSError, CheckpointError) as exc:
            why = f"the kept checkpoint {self._kept_file} cannot be used: {exc}"
            if self._accept_rollback:
                log.warning("signer: LEDGER ROLLBACK ACCEPTED (--accept-ledger-rollback): %s", why)
                return None
            self._halt(f"halted: REFUSING TO SIGN: {why}")
            return None
        return TreeHead(cp.tree_size, cp.root)

    def _keep(self, head: SignedHead) -> None:
        """Write the checkpoint of `head` beside the key (after the head is stored)."""
        if self._kept_file is None:
            return
        cp = checkpoint_of(head, self._db)
        try:
            write_checkpoint(self._kept_file, sign_note(cp.text(), self.origin, self._key))
        except OSError as exc:
            log.error("signer: cannot keep the checkpoint of tree size %d in %s (%s): a rollback "
                      "of the store would go unseen", head.tree_size, self._kept_file, exc)  # fmt: skip
            return
        self._kept = TreeHead(cp.tree_size, cp.root)

    def _check_kept(self, head: SignedHead | None, leaves: list[bytes]) -> bool:
        """serve._rollback.decide on the kept checkpoint; False when it refuses."""
        kept = self._kept = self._read_kept()
        if self.state != "signing":
            return False
        signed = leaves[: head.tree_size] if head is not None else []
        at = None
        if kept is not None and kept.size <= len(signed):
            at = Frontier.of(signed[: kept.size]).root()
        newest = None if head is None else TreeHead(head.tree_size, bytes.fromhex(head.root))
        d = decide(StartView(kept, newest, at, self._accept_rollback, str(self._kept_file)))
        if not d.sign:
            self._halt(d.message)
        elif d.problem is not None:
            log.warning("signer: %s", d.message)
        return d.sign

    def _load(self, client: Client) -> None:
        """Rebuild the tree up to the newest stored head and check it still matches (and
        reaches the kept checkpoint)."""
        self._loaded = True
        heads = read_heads(client, self._db, self.instance)
        if not heads:
            self._check_kept(None, [])
            return
        head = max(heads, key=lambda h: (h.tree_size, h.signed_at))
        ordered, info = self._batches(client, None)
        hashes = self._leaves(client, ordered[: head.batches])
        leaves = [leaf for b in ordered[: head.batches] for leaf in hashes.get(b, [])]
        frontier, nodes = Frontier().extend_nodes(leaves, CHUNK_LEVEL)
        last = ordered[head.batches - 1] if 0 < head.batches <= len(ordered) else None
        if (
            frontier.size != head.tree_size
            or frontier.root().hex() != head.root
            or last is None
            or info[last][0] != head.chain_hash
        ):
            self._halt(
                f"halted: the stored log no longer matches the newest signed head (size "
                f"{head.tree_size}); run `handoffs ledger verify`"
            )
            return
        if not self._check_kept(head, leaves):  # the store agrees with itself: and with us?
            return
        self._frontier, self._batches_signed = frontier, head.batches
        self._chain_hash, self._received_ns = head.chain_hash, info[last][2]
        self._backfill(client, ordered[: head.batches], info, hashes, nodes)
        if self._kept != TreeHead(head.tree_size, bytes.fromhex(head.root)):
            self._keep(head)  # a store signed before, or a rollback accepted
        if len(ordered) > head.batches:
            log.warning(
                "signer: %d batch(es) stored after the newest signed head while no signer ran; "
                "signing them now",
                len(ordered) - head.batches,
            )

    def _positions(
        self, start: int, batches: list[str], info: _BatchInfo, hashes: _Leaves
    ) -> list[list[object]]:
        out: list[list[object]] = []
        for b in batches:
            n = len(hashes.get(b, []))
            out.append([b, start, n, info[b][0], _time_text(info[b][2], 3), self.instance])
            start += n
        return out

    def _write_pieces(self, client: Client, positions: list[list[object]], nodes: _Nodes) -> None:
        """Nodes first: a reader takes a position reaching a head as the sign its nodes are
        stored too."""
        if nodes:
            insert_rows(
                client,
                f"{self._db}.ledger_nodes",
                ["level", "index", "hash", "instance"],
                [[lv, i, h, self.instance] for lv, i, h in nodes],
            )
        if positions:
            insert_rows(
                client,
                f"{self._db}.ledger_positions",
                ["ingest_batch", "first_leaf", "leaves", "chain_hash", "received_at", "instance"],
                positions,
            )

    def _backfill(
        self, client: Client, batches: list[str], info: _BatchInfo, hashes: _Leaves, nodes: _Nodes
    ) -> None:
        """Store the pieces of the signed log not stored yet (a store signed before them)."""
        p = {"instance": self.instance}
        have_b = {_s(b) for (b,) in client.query(
            f"SELECT DISTINCT ingest_batch FROM {self._db}.ledger_positions "
            "WHERE instance = {instance:String}", parameters=p).result_rows}  # fmt: skip
        have_n = {(int(lv), int(i)) for lv, i in client.query(
            f"SELECT DISTINCT level, index FROM {self._db}.ledger_nodes "
            "WHERE instance = {instance:String}",
            parameters=p).result_rows}  # fmt: skip
        positions = [p for p in self._positions(0, batches, info, hashes) if p[0] not in have_b]
        missing = [nd for nd in nodes if (nd[0], nd[1]) not in have_n]
        if positions or missing:
            log.info(
                "signer: storing %d batch position(s) and %d subtree(s) of the signed log",
                len(positions), len(missing),
            )  # fmt: skip
            self._write_pieces(client, positions, missing)

    def tick(self) -> bool:
        """One round: sign a head when batches were stored after the last one. True when a
        head was written."""
        if self.state != "signing":
            return False
        client = self._db_client()
        if not self._loaded:
            self._load(client)
            if self.state != "signing":
                return False
        new, info = self._batches(client, self._received_ns)
        if not new:
            if (
                self._batches_signed
                and not client.query(
                    f"SELECT count() FROM {self._db}.ingest_batches WHERE chain_hash = {{c:String}}",
                    parameters={"c": self._chain_hash},
                ).result_rows[0][0]
            ):
                self._halt(
                    "halted: the batch of the newest signed head is gone from ingest_batches "
                    "(removed or rewritten); run `handoffs ledger verify`"
                )
            return False
        hashes = self._leaves(client, new, min(info[b][2] for b in new))
        take: list[str] = []
        for b in new:  # only whole batches, in order
            if len(hashes.get(b, [])) != info[b][1]:
                break
            take.append(b)
        if not take:
            self._waits += 1
            if self._waits == _WARN_AFTER_TICKS:  # a writer mid-batch takes a tick, not 12
                b = new[0]
                log.warning(
                    "signer: batch %s has %d of its %d ledger rows; heads wait for the rest "
                    "(`handoffs ledger verify` names it)",
                    b, len(hashes.get(b, [])), info[b][1],
                )  # fmt: skip
            return False
        self._waits = 0
        frontier, nodes = self._frontier.extend_nodes(
            (leaf for b in take for leaf in hashes[b]), CHUNK_LEVEL
        )
        self._write_pieces(client, self._positions(self._frontier.size, take, info, hashes), nodes)
        head = sign_head(
            self._key,
            tree_size=frontier.size,
            root=frontier.root(),
            signed_at=self._clock(),
            batches=self._batches_signed + len(take),
            chain_hash=info[take[-1]][0],
            instance=self.instance,
        )
        insert_rows(
            client,
            f"{self._db}.ledger_heads",
            ["tree_size", "root", "signed_at", "batches", "chain_hash", "key_id", "signature",
             "instance"],
            [[head.tree_size, head.root, _time_text(head.signed_at, 9), head.batches,
              head.chain_hash, head.key_id, head.signature, head.instance]],
        )  # fmt: skip
        self._frontier, self._batches_signed = frontier, head.batches
        self._chain_hash = head.chain_hash
        self._received_ns = max(info[b][2] for b in take)
        self.heads_signed += 1
        self._keep(head)
        return True
