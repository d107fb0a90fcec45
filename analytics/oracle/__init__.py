"""The metric contract in plain Python over transition rows: one module per part of it, the
oracle the SQL of analytics/_sql/ is tested against (no ClickHouse, no pandas)."""
