"""What the tenant row policies cost a read: the same table with and without a policy, in one
engine and one run, alternating which goes first.

The store is opened as serve opens it (foundation.store.connect: the `handoffs` database's
tables have the row policies of foundation.tenant_scope); a copy of the same rows in a
database without policies is the baseline. Each round times three queries on both copies,
unbound (ingest, settle, an operator) and bound to one tenant (a tenant's read token: the
policy against the engine filter the port used alone before):

- count: `SELECT count()` over the rows of one tenant;
- scan: a LIKE over a string column of every row;
- group: counts by tenant and name.

Prints each median (ms) and the ratio with policy / without; the last line is
`RESULT unbound_ratio=<median of ratios> bound_ratio=<...>`.

    .venv/bin/python bench/tenant_scope.py --rows 2000000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from foundation.store import connect, parse_store
from foundation.tenant_scope import SCOPE_SETTING, scope_value

QUERIES = {
    "count": "SELECT count() FROM {db}.otel_traces WHERE Tenant = 'acme'",
    "scan": "SELECT count() FROM {db}.otel_traces WHERE SpanName LIKE '%7%'",
    "group": "SELECT Tenant, SpanName, count() FROM {db}.otel_traces GROUP BY Tenant, SpanName",
}
_TABLE = """CREATE TABLE {db}.otel_traces (Tenant LowCardinality(String), SpanName String,
    Timestamp DateTime64(9)) ENGINE = MergeTree ORDER BY Timestamp"""


def _time(client, sql: str, settings: dict[str, str]) -> float:
    t = time.perf_counter()
    client.query(sql, settings=settings)
    return (time.perf_counter() - t) * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000, help="rows per copy (default 2,000,000)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--repeat", type=int, default=5, help="runs of each query per round")
    args = p.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.repeat < 1:
        p.error("--rows, --rounds and --repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-scope-") as d:
        client = connect(parse_store(f"chdb://{d}"), database="")
        for db in ("handoffs", "nopolicy"):
            client.command(f"CREATE DATABASE {db}")
            client.command(_TABLE.format(db=db))
            client.command(
                f"INSERT INTO {db}.otel_traces SELECT ['acme', 'globex', 'initech'][number % 3 + 1],"
                f" concat('span-', toString(number % 1000)), now64(9) + number "
                f"FROM numbers({args.rows})"
            )
        print(f"{args.rows:,} rows per copy, 3 tenants; {args.rounds} rounds x {args.repeat} runs")
        unbound: dict[str, dict[str, list[float]]] = {
            q: {"policy": [], "none": []} for q in QUERIES
        }
        bound: dict[str, dict[str, list[float]]] = {q: {"policy": [], "none": []} for q in QUERIES}
        scoped_policy = {SCOPE_SETTING: scope_value("acme")}
        # the baseline of a bound read: the engine filter alone, as the port had it
        scoped_filter = {
            "additional_table_filters": "{'nopolicy.otel_traces': 'Tenant = ''acme'''}"
        }
        for r in range(args.rounds):
            order = [("policy", "handoffs"), ("none", "nopolicy")]
            if r % 2:
                order.reverse()
            for name, sql in QUERIES.items():
                for kind, db in order:
                    text = sql.format(db=db)
                    for _ in range(args.repeat):
                        unbound[name][kind].append(_time(client, text, {}))
                        bound[name][kind].append(
                            _time(
                                client, text, scoped_policy if kind == "policy" else scoped_filter
                            )
                        )
        ratios = {"unbound": [], "bound": []}
        for label, table in (("unbound", unbound), ("bound", bound)):
            for name in QUERIES:
                a = statistics.median(table[name]["policy"])
                b = statistics.median(table[name]["none"])
                ratios[label].append(a / b)
                print(
                    f"{label:8} {name:6} with policy {a:7.2f} ms   without {b:7.2f} ms   ratio {a / b:.2f}"
                )
        client.close()
    u = statistics.median(ratios["unbound"])
    b = statistics.median(ratios["bound"])
    print(f"RESULT unbound_ratio={u:.2f} bound_ratio={b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
