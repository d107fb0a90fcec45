-- Settled anomaly flags (analytics._sql.settled): the state pass's kinds of a handoff are
-- functions of its own rows only, so they are computed once after its rows came in and
-- kept, instead of by every anomaly query over every handoff of the window.
--   touched               when the state row was inserted (the default, filled at insert:
--                         the view does not name it); a merged row keeps the latest. Rows
--                         stored before this file get it from MATERIALIZE COLUMN (a
--                         background mutation; meanwhile a read gives the read's time, so
--                         those handoffs count as just touched: recomputed, never stale)
--   handoff_state_flags   per settled handoff with a kind set: its created time and one bit
--                         per kind (analytics._sql.settled.STATE_KIND_BITS), ordered by created
--                         time so a window reads only its own; the row of the latest settle
--                         wins (ReplacingMergeTree by `version`: 2 x the settle's time in ms,
--                         +1 for a handoff's flags, +0 for the 0 that first replaces its row
--                         of an earlier settle, whose created time may have moved)
--   anomaly_settle        per tenant, the watermarks the settle job reached: every handoff
--                         whose state rows were all touched before a tenant's latest
--                         watermark has its flags settled. A query takes the flags of those
--                         and recomputes the handoffs touched since (the live remainder).
ALTER TABLE {db}.handoff_anomaly_state ADD COLUMN IF NOT EXISTS `touched` SimpleAggregateFunction(max, DateTime64(3, 'UTC')) DEFAULT now64(3);

ALTER TABLE {db}.handoff_anomaly_state ADD INDEX IF NOT EXISTS touched_minmax `touched` TYPE minmax GRANULARITY 1;

ALTER TABLE {db}.handoff_anomaly_state MATERIALIZE COLUMN `touched`;

CREATE TABLE IF NOT EXISTS {db}.handoff_state_flags
(
    `tenant` LowCardinality(String),
    `handoff_id` String,
    `created` DateTime64(9, 'UTC'),
    `flags` UInt8,
    `version` UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (tenant, created, handoff_id);

CREATE TABLE IF NOT EXISTS {db}.anomaly_settle
(
    `tenant` LowCardinality(String),
    `watermark` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(watermark)
ORDER BY tenant;
