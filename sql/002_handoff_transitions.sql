-- One row per observed handoff transition, typed from the wire contract
-- (collector/semconv.py). Filled only by the materialized view below, from otel_traces, so
-- serve's rows and a stock OTel Collector's rows land here the same way.
--
-- Hot query 2, "everything about one handoff_id": ORDER BY starts with (tenant, handoff_id),
-- so one handoff is a single narrow range of one granule or two per partition.
-- Hot query 1, "funnel over a created-time window", reads handoff_summary (003), not this
-- table; the minmax index on time lets window scans here skip whole granules too.
-- Partition by month: a few dozen partitions a year; TTL drops whole months (ttl_only_drop_parts).
-- Retention 400 days after ingest (ingested_at, filled by default: the view does not set it):
-- auditors reconstruct handoffs months later, and an agent's clock cannot expire a row early.
-- Rows are never updated by the platform: duplicates are stored as observed and counted once
-- by the analytics. A span stored again (same trace_id, span_id, time and transition: a
-- transport resend) is one span; the same transition as another span, or under one span id
-- at another time, is a duplicate delivery, itself an anomaly to report.
CREATE TABLE IF NOT EXISTS {db}.handoff_transitions
(
    `tenant` LowCardinality(String),
    `time` DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
    `task_id` String CODEC(ZSTD(1)),
    `handoff_id` String CODEC(ZSTD(1)),
    `event` LowCardinality(String),
    `from_state` LowCardinality(String),
    `to_state` LowCardinality(String),
    `actor` LowCardinality(String),
    `valid` Bool,
    `protocol` LowCardinality(String),
    `mode` LowCardinality(String),
    `from_agent` LowCardinality(String),
    `to_agent` LowCardinality(String),
    `topology` LowCardinality(String),
    `idempotency_key` String CODEC(ZSTD(1)),
    `payload_hash` String CODEC(ZSTD(1)),
    `deadline_ms` Nullable(Int64),
    `capabilities` Array(LowCardinality(String)),
    `evidence_refs` Array(String) CODEC(ZSTD(1)),
    `evidence_count` Nullable(Int64),
    `evidence_valid` Nullable(Bool),
    `error_code` LowCardinality(String),
    `fence_token` Nullable(Int64),
    `state_version` Nullable(Int64),
    `receipt_status` LowCardinality(String),
    `receipt_hash` String CODEC(ZSTD(1)),
    `trace_id` String CODEC(ZSTD(1)),
    `span_id` String CODEC(ZSTD(1)),
    `parent_span_id` String CODEC(ZSTD(1)),
    `span_name` LowCardinality(String),
    `service_name` LowCardinality(String),
    `attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `claimed_tenant` LowCardinality(String),
    `ingest_batch` String CODEC(ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1)),
    INDEX idx_task task_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_idem idempotency_key TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_time time TYPE minmax GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (tenant, handoff_id, time)
TTL ingested_at + toIntervalDay(400)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000;

-- Array attributes travel in SpanAttributes as JSON text (the collector exporter's encoding
-- of an OTLP array value), ints and bools as their decimal / true|false text.
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.handoff_transitions_mv TO {db}.handoff_transitions AS
SELECT
    if(Tenant = '', 'default', Tenant) AS tenant,
    toDateTime64(Timestamp, 9, 'UTC') AS time,
    SpanAttributes['handoff.task_id'] AS task_id,
    SpanAttributes['handoff.handoff_id'] AS handoff_id,
    SpanAttributes['handoff.event'] AS event,
    SpanAttributes['handoff.from_state'] AS from_state,
    SpanAttributes['handoff.to_state'] AS to_state,
    SpanAttributes['handoff.actor'] AS actor,
    SpanAttributes['handoff.valid'] != 'false' AS valid,
    SpanAttributes['handoff.protocol'] AS protocol,
    SpanAttributes['handoff.mode'] AS mode,
    SpanAttributes['handoff.from_agent'] AS from_agent,
    SpanAttributes['handoff.to_agent'] AS to_agent,
    SpanAttributes['handoff.topology'] AS topology,
    SpanAttributes['handoff.idempotency_key'] AS idempotency_key,
    SpanAttributes['handoff.payload_hash'] AS payload_hash,
    toInt64OrNull(nullIf(SpanAttributes['handoff.deadline_ms'], '')) AS deadline_ms,
    JSONExtract(SpanAttributes['handoff.capabilities'], 'Array(String)') AS capabilities,
    JSONExtract(SpanAttributes['handoff.evidence_refs'], 'Array(String)') AS evidence_refs,
    toInt64OrNull(nullIf(SpanAttributes['handoff.evidence.count'], '')) AS evidence_count,
    multiIf(SpanAttributes['handoff.evidence.valid'] = 'true', true,
            SpanAttributes['handoff.evidence.valid'] = 'false', false, NULL) AS evidence_valid,
    SpanAttributes['handoff.error_code'] AS error_code,
    toInt64OrNull(nullIf(SpanAttributes['handoff.fence_token'], '')) AS fence_token,
    toInt64OrNull(nullIf(SpanAttributes['handoff.state_version'], '')) AS state_version,
    SpanAttributes['handoff.receipt.status'] AS receipt_status,
    SpanAttributes['handoff.receipt.hash'] AS receipt_hash,
    TraceId AS trace_id,
    SpanId AS span_id,
    ParentSpanId AS parent_span_id,
    SpanName AS span_name,
    ServiceName AS service_name,
    SpanAttributes AS attributes,
    SpanAttributes['handoff.tenant'] AS claimed_tenant,
    IngestBatch AS ingest_batch
FROM {db}.otel_traces
WHERE SpanAttributes['handoff.handoff_id'] != '';
