-- Settled cohort (analytics._sql.settled, analytics._sql.cohort.cohort_sql): a copy of each settled
-- handoff's merged handoff_summary row, ordered by created time, so a window's funnel,
-- slices and cohort passes read the window's rows instead of every handoff's row (the
-- summary is ordered by handoff id, which carries no time).
--   handoff_settled   per settled handoff its handoff_summary row after the merge, written by
--                     the settle job with the state flags: the row of the latest settle wins
--                     (ReplacingMergeTree by `version`, as handoff_state_flags: 2 x the
--                     settle's time in ms, +1 for the handoff's row, +0 for the `alive` = 0
--                     that first replaces its row of an earlier settle, whose created time
--                     may have moved). Only rows with `alive` = 1 are the handoff's.
--   cohort_settle     per tenant, the watermark the copy reached: a cohort reads the copy of
--                     the handoffs whose state rows were all touched before it and
--                     handoff_summary for those touched since; with no watermark (a store
--                     settled before this file, until its next settle) it reads
--                     handoff_summary alone.
CREATE TABLE IF NOT EXISTS {db}.handoff_settled
(
    `tenant` LowCardinality(String),
    `handoff_id` String,
    `task_id` String,
    `created` DateTime64(9, 'UTC'),
    `first_seen` DateTime64(9, 'UTC'),
    `last_seen` DateTime64(9, 'UTC'),
    `deadline_ms` Nullable(Int64),
    `protocol` LowCardinality(String),
    `mode` LowCardinality(String),
    `from_agent` LowCardinality(String),
    `to_agent` LowCardinality(String),
    `topology` LowCardinality(String),
    `idempotency_key` String,
    `capabilities` Array(String),
    `tmask` UInt64,
    `first_result` UInt16,
    `t_accepted` Nullable(DateTime64(9, 'UTC')),
    `t_running` Nullable(DateTime64(9, 'UTC')),
    `t_result` Nullable(DateTime64(9, 'UTC')),
    `t_committed` Nullable(DateTime64(9, 'UTC')),
    `t_unknown_in` Nullable(DateTime64(9, 'UTC')),
    `t_unknown_out` Nullable(DateTime64(9, 'UTC')),
    `transitions` UInt64,
    `uncounted` UInt64,
    `alive` UInt8,
    `version` UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (tenant, created, handoff_id);

CREATE TABLE IF NOT EXISTS {db}.cohort_settle
(
    `tenant` LowCardinality(String),
    `watermark` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(watermark)
ORDER BY tenant;
