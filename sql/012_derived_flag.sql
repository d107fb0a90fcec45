-- derived: the row carries `handoff.derived_by` (collector.semconv.DERIVED_BY: a transition
-- derive/ made from framework telemetry), computed at insert from the row's own map. The
-- funnel by origin finds the derived create rows by it (PREWHERE) instead of reading every
-- create row's map keys: at 10M transitions over 7 days that read was ~0.3 s of every
-- Overview. Rows stored before this file get it from MATERIALIZE COLUMN (a background
-- mutation; meanwhile a read computes it). tests/integration/test_derived_flag.py checks the
-- key against semconv.
ALTER TABLE {db}.handoff_transitions ADD COLUMN IF NOT EXISTS `derived` Bool MATERIALIZED mapContains(attributes, 'handoff.derived_by');

ALTER TABLE {db}.handoff_transitions MATERIALIZE COLUMN `derived`;
