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

from ingest._decode import OTEL_COLUMNS, DecodedBatch
from ingest.integrity import GENESIS, batch_hash, chain

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["BatchResult", "last_chain_hash", "make_token", "write_batch"]

_OTEL_INSERT_COLUMNS = (*OTEL_COLUMNS, "Tenant", "IngestBatch")


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


def last_chain_hash(client: Client, database: str) -> str:
    """The head of the batch hash chain (the chain_hash no batch points back to), else GENESIS.

    Follows the links rather than received_at, which concurrent requests may tie or invert.
    """
    rows = client.query(
        f"SELECT chain_hash FROM {database}.ingest_batches "
        f"WHERE chain_hash NOT IN (SELECT prev_chain_hash FROM {database}.ingest_batches) "
        "ORDER BY received_at DESC, ingest_batch DESC LIMIT 1"
    ).result_rows
    if not rows:
        return GENESIS
    h = rows[0][0]
    return h.decode() if isinstance(h, bytes) else h


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
    tenant = parts[0].tenant
    if any(p.tenant != tenant for p in parts):
        raise ValueError("write_batch: parts of one batch must share a tenant")
    cols: dict[str, list[Any]] = {c: [] for c in OTEL_COLUMNS}
    ledger_rows: list[list[Any]] = []
    reject_rows: list[list[Any]] = []
    hashes: list[str] = []
    spans = 0
    for p in parts:
        spans += p.spans
        for (_idx, handoff_id, h), span_id, trace_id in (
            (entry, p.columns["SpanId"][entry[0]], p.columns["TraceId"][entry[0]])
            for entry in p.ledger
        ):
            ledger_rows.append([tenant, handoff_id, span_id, trace_id, h, batch_id, received_at_ms])
            hashes.append(h)
        for r in p.rejects:
            reject_rows.append(
                [received_at_ms, tenant, batch_id, r.trace_id, r.span_id, r.reason, r.span_json]
            )
        for c in OTEL_COLUMNS:
            cols[c].extend(p.columns[c])
    stored = len(cols["SpanId"])

    def settings(table: str) -> dict[str, str]:
        return {
            "insert_deduplication_token": f"{batch_id}:{table}",
            "input_format_native_allow_types_conversion": "1",
        }

    if stored:
        data = [cols[c] for c in OTEL_COLUMNS] + [[tenant] * stored, [batch_id] * stored]
        _insert(
            client,
            database,
            "otel_traces",
            data,
            _OTEL_INSERT_COLUMNS,
            column_oriented=True,
            settings=settings("otel_traces"),
        )
    if ledger_rows:
        _insert(
            client,
            database,
            "transition_ledger",
            ledger_rows,
            names=[
                "tenant",
                "handoff_id",
                "span_id",
                "trace_id",
                "row_hash",
                "ingest_batch",
                "ingested_at",
            ],
            settings=settings("transition_ledger"),
        )
    if reject_rows:
        _insert(
            client,
            database,
            "ingest_rejects",
            reject_rows,
            names=[
                "received_at",
                "tenant",
                "ingest_batch",
                "trace_id",
                "span_id",
                "reason",
                "span_json",
            ],
            settings=settings("ingest_rejects"),
        )
    bh = batch_hash(sorted(hashes))  # sorted: an auditor can recompute it from the ledger
    ch = chain(prev_chain, bh)
    _insert(
        client,
        database,
        "ingest_batches",
        [
            [
                batch_id,
                tenant,
                received_at_ms,
                spans,
                len(hashes),
                len(reject_rows),
                bh,
                prev_chain,
                ch,
                source,
            ]
        ],
        names=[
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
        ],
        settings=settings("ingest_batches"),
    )
    return BatchResult(batch_id, spans, stored, len(hashes), len(reject_rows), bh, ch)
