"""What every analytics command shares: the store client, the window from --from/--to/--as-of,
the common arguments, the exit codes and the guard that turns errors into them, safe printing.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics.display import terminal_safe
from foundation import settings
from foundation.units import shorten

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from analytics import Window

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class _Usage(Exception):
    """Bad input: message printed, exit 2."""


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.strip().replace("z", "Z"))
    except ValueError:
        raise _Usage(f"{name} {value!r}: expected ISO-8601 UTC like 2026-11-23T00:00:00Z") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _window(args: argparse.Namespace) -> Window:
    from analytics import Window

    as_of = _time(args.as_of, "--as-of")
    end = _time(args.to, "--to") or as_of or datetime.now(UTC)
    start = _time(getattr(args, "from"), "--from") or end - timedelta(hours=24)
    try:
        return Window(start=start, end=end, as_of=as_of)
    except ValueError as exc:
        raise _Usage(str(exc)) from None


def _client(args: argparse.Namespace) -> tuple[Client, str]:
    from foundation.store import StoreError, StoreUnavailable, connect, parse_store

    # the driver logs connection failures itself; the CLI prints one line instead
    logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)
    try:
        spec = parse_store(args.store, database=args.database)
    except StoreError as exc:
        raise _Usage(str(exc)) from None
    if spec.embedded and not Path(spec.path or ".").is_dir():
        # these commands only read: opening the engine would create an empty store there
        raise StoreUnavailable(
            f"no store at {spec.path}: nothing was ever stored there; pass --store (or set "
            "HANDOFFS_STORE) to the store `handoffs serve` writes, e.g. --store "
            "http://127.0.0.1:8124 while it runs"
        )
    try:
        return connect(spec, database=""), spec.database
    except StoreError as exc:
        hint = ""
        if spec.embedded:
            hint = " (is `handoffs serve` holding it? then use --store http://127.0.0.1:8124)"
        if _auth_refused(str(exc)):
            raise StoreUnavailable(f"cannot open {spec.describe()}: {AUTH_REFUSED}") from None
        raise StoreUnavailable(f"{shorten(str(exc).splitlines()[0])}{hint}") from None


#: what a reader is told when the query port refuses its read token (HTTP 401, code 516)
AUTH_REFUSED = (
    "the query port refused the read token: serve's token is found by itself for a local "
    f"serve of this user; else pass it as {settings.PASSWORD.env} or http://reader:TOKEN@host:port"
)


_AUTH_FAILED = re.compile(r"AUTHENTICATION_FAILED|\bcode:? 516\b|\b401 Unauthorized", re.I)


def _auth_refused(text: str) -> bool:
    """True when a store error is the server refusing the credentials."""
    return _AUTH_FAILED.search(text) is not None


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _Usage(f"cannot write {path}: {exc.strerror or exc}") from None


def _say(line: str) -> None:
    """Print a line built from stored values (agents' ids and names): control and bidi
    characters in them are shown escaped, never acted on by the terminal."""
    print(terminal_safe(line))


def _print_table(header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[terminal_safe(c, one_line=True) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="chdb:///abs/dir or http://host:port (env HANDOFFS_STORE)")
    p.add_argument("--database", help="database name (env HANDOFFS_DATABASE, default handoffs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _windowed(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="from",
        metavar="TIME",
        help="cohort start (created time), default --to minus 24 h",
    )
    p.add_argument("--to", metavar="TIME", help="cohort end (exclusive), default --as-of")
    p.add_argument(
        "--as-of", metavar="TIME", help="clock for the settle rule and SLAs (default now)"
    )
    p.add_argument("--tenant", help="only this tenant")


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        from foundation.store import StoreUnavailable

        try:
            return func(args)
        except _Usage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except StoreUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except ValueError as exc:  # bad argument values refused by the analytics API
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:
            raise  # stdout's reader left (`| head`): handoffs.cli.main ends quietly
        except (ClickHouseError, OSError, RuntimeError) as exc:
            if _auth_refused(str(exc)):
                print(f"error: {AUTH_REFUSED}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            line = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            print(f"error: store query failed: {shorten(line)}", file=sys.stderr)
            return EXIT_UNAVAILABLE

    return run
