-- Settled audit flags (analytics._sql.settled_audits): the contract checks decided by a
-- handoff's own rows (evidence policy and reply contract, deadline, tool budget and ack,
-- grant caller and presence) or by its few relations (a retry after a final refusal: the
-- refused attempt of its task or its retry_of; a keyless write: the writes sharing its
-- target and payload hash), kept per handoff by the settle job as the relation flags are,
-- so that a query reads their bits instead of the attribute maps of every declaring row.
--   handoff_audit_flags  per settled handoff with a bit set or a keyless gap: its created
--                        time, one bit per kind or fact (AUDIT_BITS) and the ns since the
--                        keyless write before it in its group (the kind for any
--                        HANDOFFS_KEYLESS_WINDOW_S); the row of the latest settle wins
--                        (ReplacingMergeTree by `version`).
--   audit_settle         per tenant, the watermark the audit flags reached, the keyless
--                        window the settle used (a keyless gap up to it is exact; a query
--                        with a longer window recomputes that pass) and whether grants were
--                        required (missing_grant is kept only then). With none (a store
--                        settled before this file, until its next settle) a query
--                        recomputes the passes.
CREATE TABLE IF NOT EXISTS {db}.handoff_audit_flags
(
    `tenant` LowCardinality(String),
    `handoff_id` String,
    `created` DateTime64(9, 'UTC'),
    `flags` UInt32,
    `keyless_gap_ns` Nullable(Int64),
    `version` UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (tenant, created, handoff_id);

CREATE TABLE IF NOT EXISTS {db}.audit_settle
(
    `tenant` LowCardinality(String),
    `watermark` DateTime64(3, 'UTC'),
    `keyless_window_s` UInt32 DEFAULT 0,
    `require_grants` UInt8 DEFAULT 0
)
ENGINE = ReplacingMergeTree(watermark)
ORDER BY tenant;
