"""CLI subcommands of ingest/: `ingest FILE...`, `ledger verify` (alias `verify-chain`)."""

from __future__ import annotations

import argparse
import sys

from foundation import settings

EXIT_UNAVAILABLE = 3


def register(sub: argparse._SubParsersAction) -> None:
    """Add this area's subcommands to the `handoffs` parser."""
    from ingest._files_cli import register_ingest

    register_ingest(sub)

    led = sub.add_parser("ledger", help="the ingest ledger: `ledger verify`")
    ls = led.add_subparsers(dest="ledger_command", metavar="COMMAND")
    _verify_args(
        ls.add_parser(
            "verify",
            help="check every ingest batch's ledger rows and chain link, the whole log against "
            "its signed heads (naming the first bad position), and every stored transition "
            "against its ledger entry (exit 1 if not intact)",
        )
    )
    led.set_defaults(func=lambda _a: (led.print_help(), 2)[1])
    _verify_args(
        sub.add_parser("verify-chain", help="the same as `ledger verify` (its former name)")
    )


def _verify_args(v: argparse.ArgumentParser) -> None:
    v.add_argument(
        "--store",
        help=f"chdb:///dir or http://host:port, e.g. serve's query port (env {settings.STORE.env})",
    )
    v.add_argument("--database", help=f"database (env {settings.DATABASE.env})")
    v.add_argument(
        "--public-key",
        action="append",
        metavar="PUB",
        help="a public key the heads may be signed with (repeat for rotated keys); without "
        "one the signatures are not checked",
    )
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify_chain)


def _verify_chain(args: argparse.Namespace) -> int:
    import json

    from foundation.keys import KeyFileError, PublicKeys, load_public_key
    from foundation.store import StoreError, connect, parse_store
    from ingest._verify import verify_ledger

    try:
        keys = (
            PublicKeys.of(load_public_key(p) for p in args.public_key) if args.public_key else None
        )
    except KeyFileError as exc:
        print(f"handoffs ledger verify: {exc}", file=sys.stderr)
        return 2
    try:
        spec = parse_store(args.store, database=args.database)
        client = connect(spec)
    except StoreError as exc:
        print(f"handoffs ledger verify: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        report = verify_ledger(client, spec.database, keys)
    finally:
        client.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        state = "intact" if report.ok else "NOT intact"
        log = report.log
        print(f"{report.chain.batches} ingest batches, {len(report.chain.heads)} chain head(s); "
              f"log of {log.leaves} leaves, {log.heads} signed head(s), {log.verified_size} "
              f"leaves verified; {report.rows.rows} stored transitions checked against the "
              f"ledger: {state}")  # fmt: skip
        if len(report.instances) > 1 or any(i for i, _r in report.instances):
            for inst, r in report.instances:
                print(f"  instance {inst or '(none)'}: log of {r.leaves} leaves, {r.heads} signed "
                      f"head(s), {r.verified_size} leaves verified"
                      + ("" if r.first_bad is None else f", first bad position: leaf {r.first_bad}")
                      + f": {'intact' if r.ok else 'NOT intact'}")  # fmt: skip
        elif log.first_bad is not None:
            print(f"  first bad position: leaf {log.first_bad}")
        for p in report.problems:
            print(f"  {p}")
        for n in log.notes:
            print(f"  note: {n}")
    return 0 if report.ok else 1
