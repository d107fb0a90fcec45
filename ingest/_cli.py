"""CLI subcommands of ingest/: `ingest FILE...` and `verify-chain`."""

from __future__ import annotations

import argparse
import sys

from foundation import settings

EXIT_UNAVAILABLE = 3


def register(sub: argparse._SubParsersAction) -> None:
    """Add this area's subcommands to the `handoffs` parser."""
    from ingest._files_cli import register_ingest

    register_ingest(sub)

    v = sub.add_parser(
        "verify-chain",
        help="check the ingest hash chain: every batch's ledger rows and chain link (exit 1 if not intact)",
    )
    v.add_argument(
        "--store",
        help=f"chdb:///dir or http://host:port, e.g. serve's query port (env {settings.STORE.env})",
    )
    v.add_argument("--database", help=f"database (env {settings.DATABASE.env})")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify_chain)


def _verify_chain(args: argparse.Namespace) -> int:
    import json

    from foundation.store import StoreError, connect, parse_store
    from ingest._verify import verify_chain

    try:
        spec = parse_store(args.store, database=args.database)
        client = connect(spec)
    except StoreError as exc:
        print(f"handoffs verify-chain: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        report = verify_chain(client, spec.database)
    finally:
        client.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        state = "intact" if report.ok else "NOT intact"
        print(f"{report.batches} ingest batches, {len(report.heads)} chain head(s): {state}")
        for p in report.problems:
            print(f"  {p}")
    return 0 if report.ok else 1
