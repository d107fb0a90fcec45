-- Integrity and bookkeeping of serve's ingest path (ingest/).
--
-- transition_ledger: one row per stored handoff transition, written by serve in the same
-- batch as the span, holding row_hash = foundation.integrity.row_hash(...) over the columns an
-- auditor relies on. `handoffs evidence verify` recomputes the hash from handoff_transitions
-- as they are now and names every row whose hash differs (an ALTER UPDATE after ingest).
-- ingest_batches: one row per batch, chained: chain_hash = sha256(prev_chain_hash || batch_hash),
-- batch_hash = integrity.batch_hash of the batch's ledger row hashes SORTED ascending (so an
-- auditor recomputes it from transition_ledger alone), so deleting or rewriting ledger
-- rows is itself detectable.
-- Both ordered for their one lookup (by handoff_id; by batch time).
CREATE TABLE IF NOT EXISTS {db}.transition_ledger
(
    `tenant` LowCardinality(String),
    `handoff_id` String CODEC(ZSTD(1)),
    `span_id` String CODEC(ZSTD(1)),
    `trace_id` String CODEC(ZSTD(1)),
    `row_hash` FixedString(64),
    `ingest_batch` String CODEC(ZSTD(1)),
    `ingested_at` DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (tenant, handoff_id, span_id)
TTL toDateTime(ingested_at) + toIntervalDay(400)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS {db}.ingest_batches
(
    `ingest_batch` String,
    `tenant` LowCardinality(String),
    `received_at` DateTime64(3, 'UTC'),
    `spans` UInt32,
    `transitions` UInt32,
    `rejected` UInt32,
    `batch_hash` FixedString(64),
    `prev_chain_hash` FixedString(64),
    `chain_hash` FixedString(64),
    `source` LowCardinality(String)
)
ENGINE = MergeTree
ORDER BY (received_at, ingest_batch)
SETTINGS non_replicated_deduplication_window = 10000;

-- Spans refused by validation, kept with the reason (never silently dropped). 30 days.
CREATE TABLE IF NOT EXISTS {db}.ingest_rejects
(
    `received_at` DateTime64(3, 'UTC'),
    `tenant` LowCardinality(String),
    `ingest_batch` String,
    `trace_id` String,
    `span_id` String,
    `reason` String,
    `span_json` String CODEC(ZSTD(3))
)
ENGINE = MergeTree
PARTITION BY toDate(received_at)
ORDER BY (tenant, received_at)
TTL toDateTime(received_at) + toIntervalDay(30)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
