"""The store side of a group's write, behind one Protocol (WriteBackend), and what it writes:
the requests waiting to be stored (Pending) and a group of them under one token (Group).

Two implementations, chosen per group by how its requests were decoded: RowsBackend (the
Python decoder's rows: ingest._inserts.write_group) and StagedBackend (requests chDB decoded
into staging tables: ingest._inserts.write_staged_*). Backends chooses between them and is
what Ingestor uses unless given `backend=` (tests give a real alternative that wraps it,
e.g. one that fails some writes first: tests/integration/_backends.py). InMemoryBackend
records the calls instead of storing, for tests of the side that calls it.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self

from ingest._inserts import (
    BatchResult,
    GroupRows,
    Member,
    write_group,
    write_staged_chain,
    write_staged_data,
)
from ingest._plan import Request

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._decode import DecodedBatch
    from ingest.chdb import Staged

__all__ = [
    "Backends",
    "Group",
    "InMemoryBackend",
    "Pending",
    "RowsBackend",
    "StagedBackend",
    "WriteBackend",
]


@dataclass(frozen=True, slots=True)
class Pending:
    """One accepted request waiting to be stored: spool seq, batch id, receive time (epoch
    ms), its decoded rows (or only its span count when chDB staged it), body and format
    (for parking and re-decoding), and its staging handle when chDB decoded it."""

    seq: int
    batch_id: str
    received_at_ms: int
    decoded: DecodedBatch
    body: bytes | None = None
    fmt: str = ""
    stage: Staged | None = None

    @property
    def request(self) -> Request:
        """The planner's view of it."""
        return Request(
            self.seq,
            self.batch_id,
            self.decoded.tenant,
            self.decoded.spans,
            self.stage is not None,
            len(self.body or b""),
        )


@dataclass(frozen=True, slots=True)
class Group:
    """One group to store: its requests in spool order (of any tenants: every row carries
    its own) and the dedup token every insert of the group carries."""

    members: tuple[Pending, ...]
    token: str


class WriteBackend(Protocol):
    """Stores one group: its data (spans, and through them the handoff tables; ledger rows;
    rejects), then its chain rows (one ingest_batches row per request, linked in order).

    Who owns what:

    * The backend is built on a client, a database and a source (the ledger log its chain
      rows name) and writes with those only. It does not own the client: whoever opened it
      closes it (Ingestor: its own client and the writer's extra connections). `on(client)`
      is the same backend on another connection, for two groups' data written at once.
    * The caller (ingest._execute.Executor, on the writer thread) owns the chain head: it
      passes `prev_chain` and moves the head to the last BatchResult's chain_hash once
      `chain` or `write` returned. A backend keeps no chain state between calls.
    * Threads: `chain` and `write` run on the writer thread; `data` of two or three groups
      may run at once (ingest-writer-a, -c), each on a backend `on` gave for its own client:
      whatever those backends share must be safe to touch from two threads.
    * The caller orders the steps: `chain` only after the group's `data` and the previous
      group's chain rows (a chain row without its data, or ahead of its predecessor, would
      fail verification after a crash). `write` is `data`, then `chain`.
    * The caller retries. A method raises what the client raises (a connection error, a
      ClickHouse DatabaseError) and may have stored part of the group; the caller writes
      the group again under the same token (or splits or parks it: ingest._plan.on_failure),
      and every insert is idempotent under `<token>:<table>`, so nothing is stored twice.
      ValueError: a group no backend can write (empty, or staged and not staged mixed; the
      writer thread re-decodes a mixed group before it gets here), never a store failure.
    """

    def on(self, client: Client) -> WriteBackend:
        """This backend writing on `client` (the caller's connection; it closes it)."""
        ...

    def data(self, group: Group) -> None:
        """The group's spans, ledger rows and rejects; independent of other groups."""
        ...

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        """The group's ingest_batches rows linked from `prev_chain`; one result a request."""
        ...

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        """`data`, then `chain`."""
        ...


class _Bound:
    """What a backend is built with, `on` another client, and `write` as data then chain."""

    def __init__(self, client: Client, database: str, *, source: str) -> None:
        self.client, self.database, self.source = client, database, source

    def on(self, client: Client) -> Self:
        return type(self)(client, self.database, source=self.source)

    def _link(self, group: Group, prev_chain: str) -> dict[str, str]:
        """A chain insert's keywords: the group's token, the link, this backend's source."""
        return {"token": group.token, "prev_chain": prev_chain, "source": self.source}

    def data(self, group: Group) -> None:
        raise NotImplementedError

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        raise NotImplementedError

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        self.data(group)
        return self.chain(group, prev_chain)


def _members(group: Group) -> list[Member]:
    return [Member(x.batch_id, x.decoded, x.received_at_ms) for x in group.members]


def _staged(group: Group) -> list[tuple[Staged, int]]:
    out = [(x.stage, x.received_at_ms) for x in group.members if x.stage is not None]
    if len(out) != len(group.members):  # the writer re-decodes mixed groups; never drop one
        raise ValueError("a staged write group holds a request that is not staged")
    return out


class RowsBackend(_Bound):
    """Python-decoded rows, one insert per table (ingest._inserts.write_group)."""

    def data(self, group: Group) -> None:
        GroupRows(_members(group)).insert_data(self.client, self.database, group.token)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        rows = GroupRows(_members(group), prev_chain, self.source)
        rows.insert_chain(self.client, self.database, group.token)
        return rows.results

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        # one pass over the rows for both steps (data then chain, as write_group says)
        link = self._link(group, prev_chain)
        return write_group(self.client, self.database, _members(group), **link)


class StagedBackend(_Bound):
    """chDB-staged requests, copied inside the store (INSERT ... SELECT)."""

    def data(self, group: Group) -> None:
        write_staged_data(self.client, self.database, _staged(group), token=group.token)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        tenants = [x.decoded.tenant for x in group.members]
        link = self._link(group, prev_chain)
        return write_staged_chain(
            self.client, self.database, _staged(group), tenants=tenants, **link
        )


class Backends(_Bound):
    """The default WriteBackend: StagedBackend for a group chDB decoded, else RowsBackend."""

    def __init__(self, client: Client, database: str, *, source: str) -> None:
        super().__init__(client, database, source=source)
        self.rows = RowsBackend(client, database, source=source)
        self.staged = StagedBackend(client, database, source=source)

    def _for(self, group: Group) -> WriteBackend:
        staged = bool(group.members) and group.members[0].stage is not None
        return self.staged if staged else self.rows

    def data(self, group: Group) -> None:
        self._for(group).data(group)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        return self._for(group).chain(group, prev_chain)

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        return self._for(group).write(group, prev_chain)


class InMemoryBackend(_Bound):
    """A WriteBackend that stores nothing: `calls` lists each step it took, as (step, client,
    batch ids) with step "data" or "chain", and `chain` answers what a store would (the
    BatchResults of GroupRows; Python-decoded requests only: ValueError for a staged one).
    `fail`: exceptions raised one per step, in order, before the step is recorded. The
    backends `on` gives share `calls` and `fail` (under one lock) with this one."""

    def __init__(
        self,
        client: Any = None,
        database: str = "",
        *,
        source: str = "test",
        fail: Iterable[BaseException] = (),
    ) -> None:
        super().__init__(client, database, source=source)
        self.calls: list[tuple[str, Any, tuple[str, ...]]] = []
        self.fail: deque[BaseException] = deque(fail)
        self._lock = threading.Lock()

    def on(self, client: Client) -> Self:
        other = copy.copy(self)  # the same calls, failures and lock
        other.client = client
        return other

    def _step(self, step: str, group: Group) -> None:
        if any(x.stage is not None for x in group.members):
            raise ValueError("InMemoryBackend: staged requests are not supported")
        with self._lock:
            error = self.fail.popleft() if self.fail else None
            if error is None:
                self.calls.append((step, self.client, tuple(x.batch_id for x in group.members)))
        if error is not None:
            raise error

    def data(self, group: Group) -> None:
        self._step("data", group)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        self._step("chain", group)
        return GroupRows(_members(group), prev_chain, self.source).results
