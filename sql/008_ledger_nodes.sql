-- The ledger log stored in pieces, so a package's inclusion proofs read O(log n) rows instead
-- of the whole log (serve/_signer.py writes them as it extends the tree; foundation.merkle
-- inclusion_proof_from and root_from assemble proofs and roots from them).
--
-- ledger_positions: where each batch's leaves sit in the log (sql/007: batches in chain
-- order, each batch's row hashes sorted): leaves first_leaf .. first_leaf + leaves - 1;
-- `chain_hash` its chain link, `received_at` its receive time (its ledger rows' ingested_at,
-- so a reader of its rows skips older partitions and parts).
-- ledger_nodes: the hash (32 raw bytes) of every complete aligned subtree of the log of 2^level
-- leaves, level >= the chunk level (foundation.ledger_log.CHUNK_LEVEL): subtree `index`
-- covers leaves index * 2^level .. (index + 1) * 2^level - 1. Below that level a proof hashes
-- the leaves of one chunk. Both are derived data: an auditor needs neither (a package's
-- proofs verify against its signed head alone); a signer that writes a row again is
-- harmless (ReplacingMergeTree, readers use FINAL).
CREATE TABLE IF NOT EXISTS {db}.ledger_positions
(
    `ingest_batch` String,
    `first_leaf` UInt64,
    `leaves` UInt32,
    `chain_hash` FixedString(64),
    `received_at` DateTime64(3, 'UTC'),
    INDEX batch_idx ingest_batch TYPE bloom_filter GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (first_leaf, ingest_batch)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.ledger_nodes
(
    `level` UInt8,
    `index` UInt64,
    `hash` FixedString(32)
)
ENGINE = ReplacingMergeTree
ORDER BY (level, index)
SETTINGS non_replicated_deduplication_window = 10000;
