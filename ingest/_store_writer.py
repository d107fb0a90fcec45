"""The store side of a write, behind one Protocol: a group's data, then its chain rows.

Two implementations, chosen per group by how its requests were decoded: RowsWriter (the
Python decoder's rows: ingest._writer.write_group) and StagedWriter (requests chDB decoded
into staging tables: ingest._writer.write_staged_*). StoreWriters dispatches between them
and is what Ingestor uses unless a `store_writer=` is given (tests pass a real alternative
that wraps it, e.g. one that fails some writes first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ingest._planner import Request
from ingest._writer import (
    BatchResult,
    Member,
    write_group,
    write_group_chain,
    write_group_data,
    write_staged_chain,
    write_staged_data,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest._decode import DecodedBatch
    from ingest.chdb import Staged

__all__ = ["Pending", "RowsWriter", "StagedWriter", "StoreWriter", "StoreWriters"]


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


class StoreWriter(Protocol):
    """Writes one group (in spool order; its requests may be of several tenants, every row
    carries its own) into `database`. `write` is `write_data` then `write_chain`. Every
    insert is idempotent under `token`, so a group written again after a failure stores
    nothing twice. Raise what the client raises."""

    def write(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]: ...

    def write_data(
        self, client: Client, database: str, group: Sequence[Pending], *, token: str
    ) -> None: ...

    def write_chain(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]: ...


def _members(group: Sequence[Pending]) -> list[Member]:
    return [Member(x.batch_id, x.decoded, x.received_at_ms) for x in group]


def _staged(group: Sequence[Pending]) -> list[tuple[Staged, int]]:
    out = [(x.stage, x.received_at_ms) for x in group if x.stage is not None]
    if len(out) != len(group):  # the shell re-decodes mixed groups; never drop one
        raise ValueError("a staged write group holds a request that is not staged")
    return out


class RowsWriter:
    """Python-decoded rows, one insert per table (ingest._writer.write_group)."""

    def write(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        return write_group(
            client, database, _members(group), token=token, prev_chain=prev_chain, source=source
        )

    def write_data(
        self, client: Client, database: str, group: Sequence[Pending], *, token: str
    ) -> None:
        write_group_data(client, database, _members(group), token=token)

    def write_chain(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        return write_group_chain(
            client, database, _members(group), token=token, prev_chain=prev_chain, source=source
        )


class StagedWriter:
    """chDB-staged requests, copied inside the store (INSERT ... SELECT)."""

    def write(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        self.write_data(client, database, group, token=token)
        return self.write_chain(
            client, database, group, token=token, prev_chain=prev_chain, source=source
        )

    def write_data(
        self, client: Client, database: str, group: Sequence[Pending], *, token: str
    ) -> None:
        write_staged_data(client, database, _staged(group), token=token)

    def write_chain(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        return write_staged_chain(
            client,
            database,
            _staged(group),
            tenants=[x.decoded.tenant for x in group],
            token=token,
            prev_chain=prev_chain,
            source=source,
        )


class StoreWriters:
    """The default StoreWriter: StagedWriter for a group chDB decoded, else RowsWriter."""

    def __init__(self) -> None:
        self.rows = RowsWriter()
        self.staged = StagedWriter()

    def _for(self, group: Sequence[Pending]) -> RowsWriter | StagedWriter:
        return self.staged if group and group[0].stage is not None else self.rows

    def write(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        return self._for(group).write(
            client, database, group, token=token, prev_chain=prev_chain, source=source
        )

    def write_data(
        self, client: Client, database: str, group: Sequence[Pending], *, token: str
    ) -> None:
        self._for(group).write_data(client, database, group, token=token)

    def write_chain(
        self,
        client: Client,
        database: str,
        group: Sequence[Pending],
        *,
        token: str,
        prev_chain: str,
        source: str,
    ) -> list[BatchResult]:
        return self._for(group).write_chain(
            client, database, group, token=token, prev_chain=prev_chain, source=source
        )
