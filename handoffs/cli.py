"""`handoffs` command line: routing only. Each area registers its own subcommands.

Exit codes used by every subcommand: 0 success, 1 the check failed (e.g. an evidence package
that does not verify, an SLO breached with --fail-on-breach), 2 bad usage or input,
3 the store or server cannot be reached; 141 (as a process killed by SIGPIPE) when the
reader of its output left early, e.g. `handoffs metrics | head`, quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE

#: A package's `register(subparsers)`: adds its subcommands with `set_defaults(func=...)`,
#: where func(args) -> int exit code.
Register = Callable[[argparse._SubParsersAction], None]


def _registers() -> tuple[Register, ...]:
    """Every package's subcommand registration, in `handoffs --help` order.

    Real imports, so `lint-imports` sees the shell's edges into each package (the only
    imports of another package's private modules it allows: pyproject.toml). Imported here
    rather than at the top so `import handoffs.cli` alone stays cheap; each module keeps its
    own heavy imports inside its command functions (tests/unit/test_cli_lazy_imports.py).
    """
    from analytics._cli import (
        alerts,  # alerts check, watch
        evidence,  # evidence
        keyless,  # keyless
        rejections,  # rejections, refusals
    )
    from analytics._cli import blind_spots as blind  # blind-spots
    from analytics._cli import metrics as analytics  # metrics, anomalies, report
    from dashboard import _cli as dashboard  # dashboard
    from foundation import _keys_cli as keys  # keys generate
    from foundation import _tenants_cli as tenants  # tenants row-policies
    from handoffs import _demo_cli as demo  # simulate, demo
    from ingest import _cli as ingest  # ingest, ledger, verify-chain
    from serve import _cli as serve  # serve

    return (
        serve.register,
        ingest.register,
        analytics.register,
        evidence.register,
        alerts.register,
        rejections.register,
        keyless.register,
        blind.register,
        dashboard.register,
        demo.register,
        keys.register,
        tenants.register,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="handoffs",
        description="Handoff Observatory: observe and audit handoffs between AI agents.",
        epilog="Store: --store chdb:///abs/dir (embedded, default ./handoffs-data) or http://host:port; "
        "env HANDOFFS_STORE. Times are ISO-8601 UTC, e.g. 2026-11-23T00:00:00Z.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _registers():
        register(sub)
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
