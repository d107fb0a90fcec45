-- Signed tree heads of the ledger log (serve/_signer.py; verified by `handoffs ledger verify`
-- and `handoffs evidence verify`).
--
-- The log is an RFC 9162 Merkle tree (foundation/merkle.py) whose leaves are the ledger row
-- hashes (transition_ledger.row_hash as 32 raw bytes) in an order the existing chain fixes:
-- the ingest_batches rows walked from GENESIS along prev_chain_hash -> chain_hash
-- (foundation.integrity.chain_order), each batch's row hashes sorted ascending, exactly
-- the order batch_hash covers. Nothing in the ingest write path changes for the log.
-- One row per signed head: the log had `tree_size` leaves with root `root` after `batches`
-- batches ending at chain link `chain_hash`; `signature` is Ed25519 (hex) by the key whose
-- id is `key_id` over foundation.keys.SignedHead.message(). Rows are only appended.
CREATE TABLE IF NOT EXISTS {db}.ledger_heads
(
    `tree_size` UInt64,
    `root` FixedString(64),
    `signed_at` DateTime64(9, 'UTC'),
    `batches` UInt64,
    `chain_hash` FixedString(64),
    `key_id` LowCardinality(String),
    `signature` String
)
ENGINE = MergeTree
ORDER BY (tree_size, signed_at)
SETTINGS non_replicated_deduplication_window = 10000;
