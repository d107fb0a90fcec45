-- Several serves on one store (a ClickHouse server), each keeping its own ledger log.
--
-- A serve has an instance id (foundation.settings.INSTANCE_ID; by default derived from its
-- host and spool directory). It writes its ingest_batches rows with `source` =
-- '<source>@<instance>' and chains them from GENESIS on its own: the batches of one instance
-- form one chain, and the instance's log (sql/007) is that chain's ledger row hashes
-- (foundation.ledger_log.INSTANCE_SQL reads the instance back from `source`; a batch whose
-- source has no '@' belongs to the instance '', the one log of a store written before
-- instances; a batch of no instance past the first extends the log it is chained onto:
-- foundation.ledger_instances.log_links). So two serves never interleave positions: each assigns leaf positions in its
-- own log only, and its signer signs only its own log's heads.
-- ledger_heads.instance, ledger_positions.instance, ledger_nodes.instance: the log a head, a
-- position or a stored subtree is of ('' on rows written before this file); the subtrees'
-- sorting key takes the instance, so two logs' subtrees at one place are both kept.
ALTER TABLE {db}.ledger_heads ADD COLUMN IF NOT EXISTS `instance` LowCardinality(String) DEFAULT '';

ALTER TABLE {db}.ledger_positions ADD COLUMN IF NOT EXISTS `instance` LowCardinality(String) DEFAULT '';

ALTER TABLE {db}.ledger_nodes ADD COLUMN IF NOT EXISTS `instance` LowCardinality(String), MODIFY ORDER BY (level, index, instance);
