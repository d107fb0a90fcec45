-- Blind spots (derive._blind): per (tenant, trace) in which two or more distinct agents ran,
-- the derivation pass's verdict: `blind` when nothing was derived from the trace and it holds
-- no handoff transition (a framework no rule knows), else false (derived, or recorded by the
-- shim or an adapter). The pass writes a trace again only when its verdict changes, so a
-- trace judged blind and derived later is taken back: the row with the latest `updated`
-- wins (read FINAL). scope: the instrumentation scope of the spans naming the agents;
-- first_seen / last_seen: the trace's earliest span start and latest span end as read.
-- Kept 30 days after the last verdict, as otel_traces keeps the spans.
CREATE TABLE IF NOT EXISTS {db}.blind_spots
(
    `tenant` LowCardinality(String),
    `trace_id` String,
    `scope` LowCardinality(String),
    `agents` Array(String),
    `first_seen` DateTime64(9, 'UTC'),
    `last_seen` DateTime64(9, 'UTC'),
    `blind` Bool,
    `updated` DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY (tenant, trace_id)
TTL toDateTime(updated) + toIntervalDay(30);
