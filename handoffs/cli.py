"""`handoffs` command line: routing only. Each area registers its own subcommands.

Exit codes used by every subcommand: 0 success, 1 the check failed (e.g. an evidence package
that does not verify, an SLO breached with --fail-on-breach), 2 bad usage or input,
3 the store or server cannot be reached; 141 (as a process killed by SIGPIPE) when the
reader of its output left early, e.g. `handoffs metrics | head`, quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE

#: Modules with a `register(subparsers)` function; each adds its subcommands with
#: `set_defaults(func=...)`, where func(args) -> int exit code.
_COMMAND_MODULES = (
    "serve._cli",  # serve
    "ingest._cli",  # ingest, verify-chain
    "analytics._cli",  # metrics, anomalies, report
    "analytics._evidence_cli",  # evidence
    "analytics._alerts_cli",  # alerts check, watch
    "analytics._rejections_cli",  # rejections, refusals
    "analytics._keyless_cli",  # keyless
    "analytics._blind_cli",  # blind-spots
    "dashboard._cli",  # dashboard
    "handoffs._demo_cli",  # simulate, demo
    "foundation._keys_cli",  # keys generate
    "foundation._tenants_cli",  # tenants row-policies
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="handoffs",
        description="Handoff Observatory: observe and audit handoffs between AI agents.",
        epilog="Store: --store chdb:///abs/dir (embedded, default ./handoffs-data) or http://host:port; "
        "env HANDOFFS_STORE. Times are ISO-8601 UTC, e.g. 2026-11-23T00:00:00Z.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the interpreter flushes stdout once more at exit: point it at devnull first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
