-- Settled relation flags (analytics._sql.settled_relations): bounce, blind retry and duplicate
-- execution depend on a handoff and the handoffs it relates to (its task's transfers, the
-- attempts sharing its idempotency key, the one its retry_of names), not on the window, so
-- the settle job keeps them per handoff with the state flags.
--   handoff_relation_flags  per settled handoff with a relation kind set: its created time
--                           and one bit per kind (RELATION_KIND_BITS), ordered by created
--                           time; the row of the latest settle wins (ReplacingMergeTree by
--                           `version`, as handoff_state_flags). A settle rewrites the flags
--                           of every handoff touched since the last and of every handoff
--                           related to one of them.
--   relation_settle         per tenant, the watermark the relation flags reached. A query
--                           takes the flags of the cohort but the handoffs related to one
--                           touched since, and recomputes those; with no watermark (a store
--                           settled before this file, until its next settle) it recomputes
--                           the whole pass.
CREATE TABLE IF NOT EXISTS {db}.handoff_relation_flags
(
    `tenant` LowCardinality(String),
    `handoff_id` String,
    `created` DateTime64(9, 'UTC'),
    `flags` UInt8,
    `version` UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (tenant, created, handoff_id);

CREATE TABLE IF NOT EXISTS {db}.relation_settle
(
    `tenant` LowCardinality(String),
    `watermark` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(watermark)
ORDER BY tenant;
