"""CLI of the tenant row policies for a ClickHouse server: `handoffs tenants row-policies`."""

from __future__ import annotations

import argparse
import re
import sys

EXIT_OK, EXIT_USAGE = 0, 2
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `tenants` to the `handoffs` parser."""
    p = sub.add_parser("tenants", help="keep each tenant's readers to its rows on a server")
    ts = p.add_subparsers(dest="tenants_command", metavar="COMMAND")
    r = ts.add_parser(
        "row-policies",
        help="print the CREATE ROW POLICY statements that keep each reader user of a "
        "ClickHouse server to its tenant's rows (embedded stores have them built in)",
        description="Print one row policy per reader user and table of the schema: the "
        "reader sees its tenant's rows, no row of a table without a tenant column, and every "
        "other user (the writer, operators) keeps every row. Run the output with "
        "clickhouse-client --multiquery, again whenever the schema gains a table.",
    )
    r.add_argument(
        "--readers",
        required=True,
        metavar="USER=TENANT,...",
        help="reader users and their tenants, e.g. reader_acme=acme,reader_globex=globex",
    )
    r.add_argument(
        "--database", default="handoffs", help="the schema's database (default handoffs)"
    )
    r.add_argument(
        "--cluster",
        metavar="NAME",
        help="a cluster's schema (sql/cluster/): the policies ON CLUSTER NAME, on the local and "
        "the Distributed tables; give the cluster an interserver secret so that shards run a "
        "reader's query as that reader",
    )
    r.set_defaults(func=_row_policies)
    p.set_defaults(func=lambda _a: (p.print_help(), EXIT_USAGE)[1])


def _readers(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        user, sep, tenant = item.partition("=")
        if not sep or not _NAME.match(user) or not tenant or tenant == "*":
            raise ValueError(
                f"reader {item!r}: want USER=TENANT, a user name of letters, digits and "
                "underscores and one tenant (operators need no policy)"
            )
        out[user] = tenant
    if not out:
        raise ValueError("no reader given")
    return out


def _row_policies(args: argparse.Namespace) -> int:
    from foundation.store import schema_statements
    from foundation.tenant_scope import schema_scopes, server_policies

    try:
        readers = _readers(args.readers)
        if not _NAME.match(args.database):
            raise ValueError(f"database {args.database!r} is not a plain identifier")
    except ValueError as exc:
        print(f"handoffs tenants row-policies: {exc}", file=sys.stderr)
        return EXIT_USAGE
    statements = schema_statements(args.database, cluster=args.cluster)
    scopes = schema_scopes(stmt for _n, stmt in statements)
    sys.stdout.write(server_policies(args.database, scopes, readers, cluster=args.cluster))
    return EXIT_OK
