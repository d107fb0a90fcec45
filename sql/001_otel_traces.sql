-- Raw spans, column for column the table the OpenTelemetry Collector's ClickHouse exporter
-- writes (create_schema: false), so a stock collector can insert here directly. Two extra
-- columns with defaults, which the collector never names in its INSERT:
--   Tenant: serve writes the credential's tenant; a stock collector's rows take the
--           resource attribute `handoffs.tenant` that the operator's collector sets.
--   IngestBatch: serve's batch id (the ledger entry this row belongs to).
-- ORDER BY (ServiceName, SpanName, toDateTime(Timestamp)) is the exporter's own; handoff
-- queries never read this table (they read handoff_transitions), only the explorer reads
-- a trace's other spans, which the TraceId bloom filter serves.
--   InsertedAt: when the row was stored; retention counts from it, not from the span's own
--           clock, so a span stamped long ago (or past 2106) is kept like any other instead
--           of being dropped at insert after it was acknowledged.
-- TTL: raw spans are kept 30 days after ingest; the handoff transitions they feed far longer.
-- min_bytes_for_wide_part = 128 MiB: serve's inserts (10,000 spans, ~8 MB) are written as
--   compact parts (one data file instead of one per column): measured ~30% less CPU per
--   insert and ~50 MB less peak RSS in serve; merges turn large parts wide as usual.
CREATE TABLE IF NOT EXISTS {db}.otel_traces
(
    `Timestamp` DateTime64(9) CODEC(Delta, ZSTD(1)),
    `TraceId` String CODEC(ZSTD(1)),
    `SpanId` String CODEC(ZSTD(1)),
    `ParentSpanId` String CODEC(ZSTD(1)),
    `TraceState` String CODEC(ZSTD(1)),
    `SpanName` LowCardinality(String) CODEC(ZSTD(1)),
    `SpanKind` LowCardinality(String) CODEC(ZSTD(1)),
    `ServiceName` LowCardinality(String) CODEC(ZSTD(1)),
    `ResourceAttributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `ScopeName` String CODEC(ZSTD(1)),
    `ScopeVersion` String CODEC(ZSTD(1)),
    `SpanAttributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `Duration` UInt64 CODEC(ZSTD(1)),
    `StatusCode` LowCardinality(String) CODEC(ZSTD(1)),
    `StatusMessage` String CODEC(ZSTD(1)),
    `Events.Timestamp` Array(DateTime64(9)) CODEC(ZSTD(1)),
    `Events.Name` Array(LowCardinality(String)) CODEC(ZSTD(1)),
    `Events.Attributes` Array(Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    `Links.TraceId` Array(String) CODEC(ZSTD(1)),
    `Links.SpanId` Array(String) CODEC(ZSTD(1)),
    `Links.TraceState` Array(String) CODEC(ZSTD(1)),
    `Links.Attributes` Array(Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    `Tenant` LowCardinality(String) DEFAULT ResourceAttributes['handoffs.tenant'],
    `IngestBatch` String DEFAULT '',
    `InsertedAt` DateTime DEFAULT now() CODEC(Delta, ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
TTL InsertedAt + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000, min_bytes_for_wide_part = 134217728;
