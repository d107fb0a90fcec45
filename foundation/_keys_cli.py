"""CLI of the ledger signing keys: `handoffs keys generate --out PREFIX`."""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_USAGE = 0, 2


def register(sub: argparse._SubParsersAction) -> None:
    """Add `keys` to the `handoffs` parser."""
    p = sub.add_parser("keys", help="Ed25519 keys that sign the ledger log's heads")
    ks = p.add_subparsers(dest="keys_command", metavar="COMMAND")
    g = ks.add_parser(
        "generate",
        help="write PREFIX.key (private, mode 0600: give it to serve --signing-key) and "
        "PREFIX.pub (public: give it to auditors for --public-key)",
    )
    g.add_argument("--out", required=True, metavar="PREFIX", help="file name prefix")
    g.set_defaults(func=_generate)
    p.set_defaults(func=lambda _a: (p.print_help(), EXIT_USAGE)[1])


def _generate(args: argparse.Namespace) -> int:
    from foundation.keys import generate_keypair

    try:
        key, pub, kid = generate_keypair(args.out)
    except (FileExistsError, OSError) as exc:
        print(f"handoffs keys generate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"key id {kid}: private key {key} (mode 0600, keep it secret), public key {pub}")
    return EXIT_OK
