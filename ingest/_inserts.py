"""Write decoded batches into ClickHouse: spans, ledger, rejects and the batch chain.

Every insert carries `insert_deduplication_token = <token>:<table>`, so writing the same
batch again (a replayed spool, a retried request) stores nothing twice: the tables set
`non_replicated_deduplication_window` (Replicated* tables deduplicate by default), and the
materialized view into handoff_transitions only fires for blocks that were inserted.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundation.integrity import GENESIS, batch_hash, chain
from foundation.ledger_instances import INSTANCE_SQL
from ingest._decode import OTEL_COLUMNS, DecodedBatch

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ingest.chdb import Staged

__all__ = [
    "BatchResult",
    "GroupRows",
    "Member",
    "last_chain_hash",
    "make_token",
    "write_batch",
    "write_group",
    "write_staged_chain",
    "write_staged_data",
]

_OTEL_INSERT_COLUMNS = (*OTEL_COLUMNS, "Tenant", "IngestBatch")
_SPAN_ID = OTEL_COLUMNS.index("SpanId")
_EVENT_COLS = tuple(i for i, c in enumerate(OTEL_COLUMNS) if c.startswith("Events."))
_LINK_COLS = tuple(i for i, c in enumerate(OTEL_COLUMNS) if c.startswith("Links."))
_TRACE_ID = OTEL_COLUMNS.index("TraceId")


@dataclass(frozen=True, slots=True)
class BatchResult:
    ingest_batch: str
    spans: int
    stored: int
    transitions: int
    rejected: int
    batch_hash: str
    chain_hash: str


_LC = re.compile(r"LowCardinality\((\w+)\)")
_TYPE_CACHE: dict[tuple[int, str, str], dict[str, str]] = {}


def _insert(
    client: Client, database: str, table: str, data: Any, names: Sequence[str], **kw: Any
) -> None:
    """client.insert with the column types looked up once per (client, table), not per insert."""
    key = (id(client), database, table)
    types = _TYPE_CACHE.get(key)
    if types is None:
        rows = client.query(f"DESCRIBE TABLE {database}.{table}").result_rows
        # Sent as plain String: clickhouse-connect builds LowCardinality dictionaries in Python
        # (the costliest part of an insert); the server converts Native String columns itself.
        types = _TYPE_CACHE[key] = {r[0]: _LC.sub(r"\1", r[1]) for r in rows}
    client.insert(
        f"{database}.{table}",
        data,
        column_names=list(names),
        column_type_names=[types[n] for n in names],
        **kw,
    )


def make_token(*parts: str) -> str:
    """A deterministic batch id / dedup token from its identifying parts (sha256 hex, 32 chars)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def last_chain_hash(client: Client, database: str, instance: str = "") -> str:
    """The head of `instance`'s batch hash chain (the chain_hash no batch of it points back
    to), else GENESIS. Each serve instance chains its own batches (foundation.ledger_instances).

    Follows the links rather than received_at, which concurrent requests may tie or invert.
    """
    mine = f"{INSTANCE_SQL} = {{i:String}}"
    rows = client.query(
        f"SELECT chain_hash FROM {database}.ingest_batches WHERE {mine} AND chain_hash "
        f"NOT IN (SELECT prev_chain_hash FROM {database}.ingest_batches WHERE {mine}) "
        "ORDER BY received_at DESC, ingest_batch DESC LIMIT 1",
        parameters={"i": instance},
    ).result_rows
    if not rows:
        return GENESIS
    h = rows[0][0]
    return h.decode() if isinstance(h, bytes) else h


@dataclass(frozen=True, slots=True)
class Member:
    """One request of a write group: its batch id, decoded spans and receive time (epoch ms)."""

    batch_id: str
    decoded: DecodedBatch
    received_at_ms: int


def write_batch(
    client: Client,
    database: str,
    parts: Sequence[DecodedBatch],
    *,
    batch_id: str,
    prev_chain: str,
    received_at_ms: int,
    source: str,
) -> BatchResult:
    """Insert `parts` (all of one tenant) as one ingest batch; idempotent per batch_id.

    Writes otel_traces (and through the view handoff_transitions), transition_ledger,
    ingest_rejects and one ingest_batches row whose chain_hash = chain(prev_chain, batch_hash),
    batch_hash = integrity.batch_hash(sorted row hashes of the batch's ledger rows).
    `received_at_ms` is epoch milliseconds. Raises whatever the client raises when the store
    fails; the caller retries with the same arguments.
    """
    if not parts:
        raise ValueError("write_batch: no parts")
    merged = parts[0] if len(parts) == 1 else _merge(parts)
    (res,) = write_group(
        client,
        database,
        [Member(batch_id, merged, received_at_ms)],
        token=batch_id,
        prev_chain=prev_chain,
        source=source,
    )
    return res


def _merge(parts: Sequence[DecodedBatch]) -> DecodedBatch:
    tenant = parts[0].tenant
    if any(p.tenant != tenant for p in parts):
        raise ValueError("write_batch: parts of one batch must share a tenant")
    out = DecodedBatch(tenant=tenant)
    for p in parts:
        base = out.stored
        out.rows.extend(p.rows)
        out.ledger.extend((i + base, hid, h) for i, hid, h in p.ledger)
        out.rejects.extend(p.rejects)
        out.spans += p.spans
        out.flagged += p.flagged
    return out


def write_group(
    client: Client,
    database: str,
    members: Sequence[Member],
    *,
    token: str,
    prev_chain: str,
    source: str,
) -> list[BatchResult]:
    """Insert several requests (of any tenants: each member's rows carry its own) with one
    insert per table; idempotent per token.

    Each member keeps its own ingest batch (IngestBatch / ingest_batch columns, one chained
    ingest_batches row each, in the given order); `token` (deterministic for the member set)
    deduplicates a repeated write of the group. Raises what the client raises.
    GroupRows.insert_data, then GroupRows.insert_chain.
    """
    rows = GroupRows(members, prev_chain, source)
    rows.insert_data(client, database, token)
    rows.insert_chain(client, database, token)
    return rows.results


def _settings(token: str, table: str) -> dict[str, str]:
    return {
        "insert_deduplication_token": f"{token}:{table}",
        "input_format_native_allow_types_conversion": "1",
    }


class GroupRows:
    """The rows one group of Python-decoded requests inserts into each table, and its chain
    results. `prev_chain` and `source` matter only to the chain rows (insert_chain)."""

    def __init__(
        self, members: Sequence[Member], prev_chain: str = GENESIS, source: str = ""
    ) -> None:
        if not members:
            raise ValueError("write_group: no members")
        self.members = members
        self.ledger_rows: list[list[Any]] = []
        self.reject_rows: list[list[Any]] = []
        self.batch_rows: list[list[Any]] = []
        self.results: list[BatchResult] = []
        link = prev_chain
        for m in members:
            p, bid, at, tenant = m.decoded, m.batch_id, m.received_at_ms, m.decoded.tenant
            hashes = []
            prows = p.rows
            for idx, handoff_id, h in p.ledger:
                row = prows[idx]
                self.ledger_rows.append(
                    [tenant, handoff_id, row[_SPAN_ID], row[_TRACE_ID], h, bid, at]
                )
                hashes.append(h)
            for r in p.rejects:
                self.reject_rows.append(
                    [at, tenant, bid, r.trace_id, r.span_id, r.reason, r.span_json]
                )
            bh = batch_hash(sorted(hashes))  # sorted: an auditor can recompute it from the ledger
            ch = chain(link, bh)
            self.batch_rows.append(
                [bid, tenant, at, p.spans, len(hashes), len(p.rejects), bh, link, ch, source]
            )
            self.results.append(
                BatchResult(bid, p.spans, p.stored, len(hashes), len(p.rejects), bh, ch)
            )
            link = ch

    def insert_data(self, client: Client, database: str, token: str) -> None:
        """The spans, ledger rows and rejects; independent of other groups."""
        rows: list[tuple[Any, ...]] = []
        batch_col: list[str] = []
        tenant_col: list[str] = []
        for m in self.members:
            rows.extend(m.decoded.rows)
            batch_col.extend([m.batch_id] * m.decoded.stored)
            tenant_col.extend([m.decoded.tenant] * m.decoded.stored)
        stored = len(batch_col)
        if stored:
            # rows -> columns in C (zip), then the two columns serve adds
            data = [*zip(*rows, strict=True), tenant_col, batch_col]
            names: tuple[str, ...] = _OTEL_INSERT_COLUMNS
            # Event and link columns that are empty for every span are left out: the table's
            # default is the same empty array, and clickhouse-connect encodes arrays in Python
            # (a span's event/link columns are parallel arrays: the first one tells for all).
            drop: set[int] = set()
            for group in (_EVENT_COLS, _LINK_COLS):
                if not any(data[group[0]]):
                    drop.update(group)
            if drop:
                data = [c for i, c in enumerate(data) if i not in drop]
                names = tuple(n for i, n in enumerate(names) if i not in drop)
            _insert(
                client,
                database,
                "otel_traces",
                data,
                names,
                column_oriented=True,
                settings=_settings(token, "otel_traces"),
            )
        if self.ledger_rows:
            _insert(
                client,
                database,
                "transition_ledger",
                self.ledger_rows,
                _LEDGER_COLUMNS,
                settings=_settings(token, "transition_ledger"),
            )
        if self.reject_rows:
            _insert(
                client,
                database,
                "ingest_rejects",
                self.reject_rows,
                _REJECT_COLUMNS,
                settings=_settings(token, "ingest_rejects"),
            )

    def insert_chain(self, client: Client, database: str, token: str) -> None:
        """The ingest_batches rows, one per member, linked from `prev_chain` in order: only
        after the group's data and the previous group's chain rows."""
        _insert(
            client,
            database,
            "ingest_batches",
            self.batch_rows,
            _BATCH_COLUMNS,
            settings=_settings(token, "ingest_batches"),
        )


_LEDGER_COLUMNS = (
    "tenant",
    "handoff_id",
    "span_id",
    "trace_id",
    "row_hash",
    "ingest_batch",
    "ingested_at",
)
_REJECT_COLUMNS = (
    "received_at",
    "tenant",
    "ingest_batch",
    "trace_id",
    "span_id",
    "reason",
    "span_json",
)
_BATCH_COLUMNS = (
    "ingest_batch",
    "tenant",
    "received_at",
    "spans",
    "transitions",
    "rejected",
    "batch_hash",
    "prev_chain_hash",
    "chain_hash",
    "source",
)


def _staged_settings(token: str, table: str) -> str:
    from ingest.chdb import LEAN, inline_settings

    # optimize_on_insert 0: the summary view's rows are already one per handoff (GROUP BY)
    # and the task view's distinct (DISTINCT), so merging each insert block of those
    # Aggregating/ReplacingMergeTree tables finds nothing and cost ~3% of a write's CPU
    # (measured on paired writes of 20,000 staged spans); readers merge at read time
    # (FINAL, GROUP BY or DISTINCT), as they must for rows of different inserts anyway.
    return inline_settings(
        {
            "insert_deduplication_token": f"{token}:{table}",
            "max_threads": "1",
            "optimize_on_insert": "0",
            **LEAN,
        }
    )


def write_staged_data(
    client: Client, database: str, members: Sequence[tuple[Staged, int]], *, token: str
) -> None:
    """The spans and ledger rows of a staged group (otel_traces, whose materialized views
    fill the handoff tables, and transition_ledger). Idempotent under `token`; independent
    of other groups, so two groups' data may be written at once (see write_staged_chain)."""
    from ingest.chdb import OTEL_FROM_STAGE
    from ingest.chdb import sql_string as _quote

    if not members:
        raise ValueError("write_staged_data: no members")
    by_table: dict[str, list[str]] = {}
    for st, _ in members:
        by_table.setdefault(st.table, []).append(st.batch_id)
    union = " UNION ALL ".join(
        f"SELECT * FROM {table} WHERE IngestBatch IN ({', '.join(_quote(b) for b in bids)})"
        for table, bids in by_table.items()
    )
    cols = ", ".join(OTEL_FROM_STAGE)
    client.command(
        f"INSERT INTO {database}.otel_traces ({cols}) "
        f"SETTINGS {_staged_settings(token, 'otel_traces')} SELECT {cols} FROM ({union})"
    )
    client.command(
        f"INSERT INTO {database}.transition_ledger ({', '.join(_LEDGER_COLUMNS)}) "
        f"SETTINGS {_staged_settings(token, 'transition_ledger')} "
        "SELECT Tenant, handoff_id, SpanId, TraceId, row_hash, IngestBatch, ingested_at "
        f"FROM ({union}) WHERE is_handoff"
    )


def write_staged_chain(
    client: Client,
    database: str,
    members: Sequence[tuple[Staged, int]],
    *,
    tenants: Sequence[str],
    token: str,
    prev_chain: str,
    source: str,
) -> list[BatchResult]:
    """The ingest_batches rows of a staged group (`tenants`: each member's), linked from
    `prev_chain`: the rows GroupRows.insert_chain writes for the same requests decoded by
    Python (the batch hashes were computed when staged). Write them only after the group's
    data (write_staged_data) and the previous group's chain rows: a chain row without its
    data, or ahead of its predecessor, would break verification after a crash."""
    from ingest.chdb import sql_string as _quote

    values: list[str] = []
    results: list[BatchResult] = []
    link = prev_chain
    if len(tenants) != len(members):
        raise ValueError("write_staged_chain: one tenant per member")
    for (st, at), tenant in zip(members, tenants, strict=True):
        ch = chain(link, st.batch_hash)
        values.append(
            "("
            + ", ".join(
                [
                    _quote(st.batch_id),
                    _quote(tenant),
                    f"fromUnixTimestamp64Milli({int(at)}, 'UTC')",
                    str(int(st.spans)),
                    str(int(st.transitions)),
                    "0",
                    _quote(st.batch_hash),
                    _quote(link),
                    _quote(ch),
                    _quote(source),
                ]
            )
            + ")"
        )
        results.append(
            BatchResult(st.batch_id, st.spans, st.spans, st.transitions, 0, st.batch_hash, ch)
        )
        link = ch
    client.command(
        f"INSERT INTO {database}.ingest_batches ({', '.join(_BATCH_COLUMNS)}) "
        f"SETTINGS {_staged_settings(token, 'ingest_batches')} VALUES {', '.join(values)}"
    )
    return results
