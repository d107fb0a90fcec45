"""The foundation every other package stands on: settings (argument, then `HANDOFFS_*`
variable, then default), store access (embedded chDB or a ClickHouse server through one
clickhouse-connect client; the schema), and the integrity primitives (row hashes, the
batch hash chain). Pure or thin; imports nothing of the project above it."""
