-- Compact parts for the two wide ingest tables, on stores created before this file too
-- (MODIFY SETTING changes how new parts are written; existing parts stay as they are).
-- A part below min_bytes_for_wide_part is written compact: one data file for all columns
-- instead of one per column and substream. Measured in serve:
--   otel_traces: ~30% less CPU per insert, ~50 MB less peak RSS (set in 001 for new stores);
--   handoff_transitions (35 columns, ~90 substreams): merging 7 parts of 10,000 rows into a
--   wide part held ~180 MB (a compression buffer per substream), compact ~30 MB; and fewer
--   files per part. Merges still make wide parts once a part passes 128 MiB.
ALTER TABLE {db}.otel_traces MODIFY SETTING min_bytes_for_wide_part = 134217728;

ALTER TABLE {db}.handoff_transitions MODIFY SETTING min_bytes_for_wide_part = 134217728;
