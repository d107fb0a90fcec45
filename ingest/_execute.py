"""Executing write plans (ingest._plan) through the backend (ingest._backend): one group
until stored (retry, split, park), two groups' data at once on two connections, chain rows
in order, and the bookkeeping once a group is stored (chain head, known batch ids, spool
commits, staging-table releases).

The writer thread is the only caller, so the chain head and the known batch ids are
touched by one thread (the data written at once run on helper threads but return their
exceptions instead of touching state).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ingest._backend import Group, Pending, WriteBackend
from ingest._inserts import BatchResult, make_token
from ingest._plan import Failure, on_failure
from ingest._refusals import is_about_data
from ingest._telemetry import LatencyHistogram

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._spool import Spool
    from ingest.chdb import Stager

__all__ = ["KNOWN_BATCHES", "Executor"]

log = logging.getLogger("handoffs.ingest")
KNOWN_BATCHES = 50_000  # batch ids remembered to keep a retried request off the chain
#: the tables holding a request's own rows, each with its batch-id column (a replay's check)
ROWS_BY_BATCH = (
    ("otel_traces", "IngestBatch"),
    ("handoff_transitions", "ingest_batch"),
    ("transition_ledger", "ingest_batch"),
    ("ingest_rejects", "ingest_batch"),
)

_Outcome = tuple[Group, BaseException | None]  # a group and what its data write raised


class Executor:
    """The write side's state (chain head, known batch ids, store error, counters) and its
    operations. Owns the chain head and the retries; the store side of each step is
    `backend`'s (ingest._backend.WriteBackend), which keeps no state between calls."""

    def __init__(
        self,
        client: Client,
        database: str,
        spool: Spool,
        *,
        backend: WriteBackend,
        stager: Stager | None,
        max_refusals: int,
        stop_retrying: threading.Event,
        stats: dict[str, int],
        timings: dict[str, float],
        lock: threading.Lock,
    ) -> None:
        self.client, self.database, self.spool = client, database, spool
        self.backend, self.stager = backend, stager
        self.max_refusals = max_refusals
        self._stop_retrying = stop_retrying
        self.stats, self.timings, self._lock = stats, timings, lock
        self.known: OrderedDict[str, str] = OrderedDict()
        self.chain = ""
        self.store_error: str | None = None
        self.write_latency = LatencyHistogram()

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    # ------------------------------------------------------------ bookkeeping

    def group(self, members: Sequence[Pending], *, log_group: bool = True) -> Group:
        """`members` as a group under its dedup token: the batch id of a single request; for
        several, a token of their ids, logged in the spool first when `log_group` (a replay
        regroups them exactly; a replayed group is already logged)."""
        if len(members) == 1:
            return Group(tuple(members), members[0].batch_id)
        if log_group:
            self.spool.log_group([x.seq for x in members])
        return Group(tuple(members), make_token("group", *(x.batch_id for x in members)))

    def replay(self, group: Group) -> Group:
        """The group to write a replayed `group` as (none of it is on the chain: a request
        on it is known, so skipped). A crash during a write can leave a table's part stored
        without its dedup record, or the record without the part: a MergeTree store commits
        the two apart, so a kill -9 between them makes the group's own token store rows
        twice, or drop them. So rows of the group's batches already stored are deleted and
        the group is written under a fresh token. Where the store cannot delete them (a
        cluster's Distributed tables, whose Replicated parts and dedup entries commit
        together), the group's own token is kept."""
        from ingest.chdb import sql_string

        ids = ", ".join(sql_string(x.batch_id) for x in group.members)
        db = self.database
        try:
            counts = self.client.query(
                "SELECT "
                + ", ".join(
                    f"(SELECT count() FROM {db}.{t} WHERE {c} IN ({ids}))" for t, c in ROWS_BY_BATCH
                )
            ).result_rows[0]
            for (table, column), n in zip(ROWS_BY_BATCH, counts, strict=True):
                if n:
                    self.client.command(f"DELETE FROM {db}.{table} WHERE {column} IN ({ids})")
        except Exception as exc:
            log.warning("replay: could not clear an interrupted write, its token decides: %s", exc)
            return group
        if any(counts):
            log.warning(
                "replay: %d row(s) of an interrupted write of %d request(s) removed before "
                "it is written again",
                sum(counts), len(group.members),
            )  # fmt: skip
        return Group(group.members, make_token(group.token, "replay", uuid.uuid4().hex))

    def discard(self, item: Pending) -> None:
        """A request already stored: drop its staging table, mark it done in the spool."""
        if item.stage is not None and self.stager is not None:
            self.stager.release([item.stage])
        self.spool.commit(item.seq)

    def stored(self, group: Group, results: list[BatchResult]) -> None:
        """Bookkeeping after a group's data and chain rows are in the store."""
        for res in results:
            self.known[res.ingest_batch] = res.chain_hash
            self.chain = res.chain_hash
            with self._lock:
                self.stats["stored"] += res.stored
                self.stats["rejected"] += res.rejected
                self.stats["batches"] += 1
        while len(self.known) > KNOWN_BATCHES:
            self.known.popitem(last=False)
        self.count("writes")
        if self.stager is not None:
            self.stager.release([x.stage for x in group.members if x.stage])
        self.spool.commit(*(x.seq for x in group.members))

    # ------------------------------------------------------------ one group

    def write(self, group: Group) -> None:
        """Write `group` until stored; back off between failures (0.05 s doubling to 2 s).
        Raises the store's error only once retrying stopped (stop() was called): the
        records stay in the spool. Splits or parks the group per ingest._plan.on_failure."""
        delay, refused = 0.05, 0
        while True:
            try:
                t0 = time.perf_counter()
                results = self.backend.write(group, self.chain)
                took = time.perf_counter() - t0
                self.timings["store_s"] += took
                self.write_latency.observe(took)
                self.stored(group, results)
                self.store_error = None
                return
            except Exception as exc:  # the store failed: keep the records, retry, never drop
                self.store_error = str(exc)[:500]
                self.count("store_errors")
                log.warning(
                    "store write failed (%d request(s), token %s), retrying: %s",
                    len(group.members), group.token, exc,
                )  # fmt: skip
                about_data = is_about_data(exc)
                refused += about_data
                decision = on_failure(
                    about_data=about_data,
                    refusals=refused,
                    max_refusals=self.max_refusals,
                    nothing_visible=(
                        refused >= self.max_refusals
                        and all(x.body is not None for x in group.members)
                        and self._nothing_visible(group.members)
                    ),
                    stopping=self._stop_retrying.is_set(),
                    members=len(group.members),
                )
                if decision is Failure.SPLIT:
                    self.count("split_groups")
                    for item in group.members:  # each alone, with a token of its own
                        self.write(self.group([item]))
                    self.store_error = None
                    return
                if decision is Failure.PARK:
                    self._park(group, exc)
                    self.store_error = None
                    return
                if decision is Failure.GIVE_UP:
                    raise
                self._stop_retrying.wait(delay)
                delay = min(delay * 2, 2.0)

    def _nothing_visible(self, members: Sequence[Pending]) -> bool:
        """No row of `members` is in the tables readers see (otel_traces and through it the
        handoff tables, transition_ledger, ingest_rejects). False when it cannot be told."""
        from ingest.chdb import sql_string

        ids = ", ".join(sql_string(x.batch_id) for x in members)
        db = self.database
        try:
            rows = self.client.query(
                f"SELECT (SELECT count() FROM {db}.otel_traces WHERE IngestBatch IN ({ids}))"
                f" + (SELECT count() FROM {db}.transition_ledger WHERE ingest_batch IN ({ids}))"
                f" + (SELECT count() FROM {db}.ingest_rejects WHERE ingest_batch IN ({ids}))"
            ).result_rows
        except Exception as exc:
            log.warning("could not check whether a refused group is partly stored: %s", exc)
            return False
        return int(rows[0][0]) == 0

    def _park(self, group: Group, exc: Exception) -> None:
        """Keep refused requests on disk (spool/dead: body + JSON meta), count them, commit."""
        dead = self.spool.dir / "dead"
        dead.mkdir(exist_ok=True)
        for item in group.members:
            meta = {
                "batch": item.batch_id,
                "seq": item.seq,
                "tenant": item.decoded.tenant,
                "fmt": item.fmt,
                "received_at_ms": item.received_at_ms,
                "error": str(exc)[:2000],
            }
            (dead / f"{item.batch_id}.body").write_bytes(item.body or b"")
            (dead / f"{item.batch_id}.json").write_text(json.dumps(meta, indent=1))
            log.error(
                "batch %s refused %d times by the store; parked in %s: %s",
                item.batch_id, self.max_refusals, dead, exc,
            )  # fmt: skip
            self.count("parked_batches")
            self.spool.commit(item.seq)
        if self.stager is not None:
            self.stager.release([x.stage for x in group.members if x.stage])

    # ------------------------------------------------------------ data at once

    def data(self, client: Client, group: Group) -> BaseException | None:
        """The data of a group on `client`; the exception instead of raising it."""
        try:
            (self.backend if client is self.client else self.backend.on(client)).data(group)
        except BaseException as exc:
            return exc
        return None

    def data_at_once(
        self, planned: list[Group], clients: Callable[[int], Client]
    ) -> list[_Outcome]:
        """The data of up to two groups written at once, on clients(0) and clients(1) (the
        second on a thread of its own); each with the exception its write raised (None when
        stored), in order, for chain_in_order."""
        errors: list[BaseException | None] = [None] * len(planned)

        def one(i: int) -> None:
            try:
                errors[i] = self.data(clients(i), planned[i])
            except Exception as exc:  # no connection: the group is written the usual way
                errors[i] = exc

        threads = [
            threading.Thread(target=one, args=(i,), name=f"ingest-writer-{'bc'[i]}", daemon=True)
            for i in range(1, len(planned))
        ]
        for t in threads:
            t.start()
        one(0)
        for t in threads:
            t.join()
        return list(zip(planned, errors, strict=True))

    def chain_in_order(self, parts: list[_Outcome]) -> bool:
        """After data written at once: each group's chain rows, in order. A group whose data
        write failed (the exception given) or whose chain rows fail is written again the
        usual way (write: retries; its token makes the data that did get in count once),
        before the next group's chain rows. True when nothing had to be written again."""
        clean = True
        for group, error in parts:
            try:
                if error is not None:
                    raise error
                res = self.backend.chain(group, self.chain)
            except Exception as exc:
                n = len(group.members)
                log.warning("write of %d request(s) failed, writing again: %s", n, exc)
                clean = False
                self.write(group)
                continue
            self.stored(group, res)
        return clean
