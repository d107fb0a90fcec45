"""The foundation every other package stands on; imports nothing of the project above it.
Pure or thin. Its modules, each imported by name (`from foundation import settings`):

- `settings`: every environment variable, resolved as argument, then `HANDOFFS_*`, then
  default.
- `store`: store access, embedded chDB or a ClickHouse server through one clickhouse-connect
  client; the schema (`apply_schema`) and a client's sibling connection.
- `units`: durations, counts and long messages as people read them.
- `lazy`: a package's public names loaded on first use (PEP 562).
- `http_body`: request bodies on serve's HTTP ports (framing, gzip, limits).
- `integrity`: row hashes of stored transitions and the ingest batch hash chain.
- `merkle`: the RFC 9162 Merkle tree, inclusion and consistency proofs.
- `keys`: Ed25519 keys and signed tree heads of the ledger log.
- `checkpoint`: those heads as C2SP checkpoints in signed notes.
- `ledger_log`: the ledger log's leaves and heads read from a store, and the pure check.
- `ledger_heads`: reading the signed tree heads (sql/007, sql/010).
- `ledger_instances`: serve instances on one store, each with its own ledger log.
- `read_token`: serve's operator read token and the discovery file local readers use.
- `tenant_scope`: tenant scope by the engine's row policies, for the embedded store.
- `_cluster_sql`: generates sql/cluster/ from sql/ (`python -m foundation._cluster_sql`).
- `_keys_cli`, `_tenants_cli`: `handoffs keys generate`, `handoffs tenants row-policies`.
"""
