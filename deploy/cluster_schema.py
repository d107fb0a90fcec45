"""Apply sql/cluster/ (ON CLUSTER DDL) to a ClickHouse cluster; the compose `cluster` profile
runs it once before serve starts. Idempotent: every statement is IF NOT EXISTS.

Reads HANDOFFS_STORE / HANDOFFS_DATABASE / HANDOFFS_USER / HANDOFFS_PASSWORD like every command,
and HANDOFFS_CLUSTER (the cluster name in remote_servers, default `handoffs`).
Exit 0 when applied, 3 when the server cannot be reached, 2 when sql/cluster/ is empty.
"""

from __future__ import annotations

import os
import sys

from foundation.store import StoreError, connect, parse_store, schema_statements


def main() -> int:
    cluster = os.environ.get("HANDOFFS_CLUSTER") or "handoffs"
    spec = parse_store()
    statements = schema_statements(spec.database, cluster=cluster)
    if not statements:
        print("sql/cluster/ holds no statements", file=sys.stderr)
        return 2
    try:
        client = connect(spec, database="")
    except StoreError as exc:
        print(exc, file=sys.stderr)
        return 3
    client.command(f"CREATE DATABASE IF NOT EXISTS {spec.database} ON CLUSTER '{cluster}'")
    for name, stmt in statements:
        client.command(stmt)
        print(f"applied {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
