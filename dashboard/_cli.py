"""`handoffs dashboard`: run the Streamlit app headless against a store, read-only.

The app reads the store from HANDOFFS_STORE / HANDOFFS_DATABASE, which this command sets
from --store / --database. An embedded (chdb://) store is read through `handoffs serve`'s
query port, never opened by the dashboard (chDB locks the directory to one process).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from foundation import settings
from foundation.store import StoreError, parse_store

__all__ = ["APP_PATH", "register", "streamlit_command", "streamlit_env"]

APP_PATH = Path(__file__).resolve().parent / "app.py"
_EXIT_USAGE, _EXIT_UNAVAILABLE = 2, 3


def streamlit_command(
    *, port: int = 8501, host: str = "127.0.0.1", python: str | None = None
) -> list[str]:
    """argv of `streamlit run dashboard/app.py`, headless, no telemetry, no file watcher.

    Raises ValueError naming `port` when it is outside 1..65535 (0 is refused: the URL must
    be known to print it).
    """
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
    if not host:
        raise ValueError("host must not be empty")
    return [
        python or sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--browser.gatherUsageStats=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
    ]


def streamlit_env(
    *,
    store: str | None = None,
    database: str | None = None,
    rules: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for the app: `base` (default os.environ) with the resolved store and database,
    and `rules` (the Alerts page's SLO rules file) as an absolute path when given.

    Raises foundation.store.StoreError naming what is wrong with a malformed store URL, and
    ValueError when `rules` is not a readable file.
    """
    env = dict(os.environ if base is None else base)
    raw = store or env.get(settings.STORE.env) or settings.STORE.default
    spec = parse_store(raw, database=database or env.get(settings.DATABASE.env) or None)
    env[settings.STORE.env] = f"chdb://{spec.path}" if spec.embedded else raw
    env[settings.DATABASE.env] = spec.database
    if rules:
        path = Path(rules).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--rules {rules}: no such file (an SLO rules file, docs/alerts.md)")
        env[settings.SLO_RULES.env] = str(path)
    return env


def _without_password(url: str) -> str:
    """`url` with the password of its user info (a read token) replaced by `***`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _run(args: argparse.Namespace) -> int:
    try:
        env = streamlit_env(store=args.store, database=args.database, rules=args.rules)
        argv = streamlit_command(port=args.port, host=args.host)
    except (StoreError, ValueError) as exc:
        print(f"handoffs dashboard: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    store = env[settings.STORE.env]
    if store.startswith("chdb://"):
        port = settings.resolve(settings.QUERY_PORT)
        print(
            f"handoffs dashboard: {store} is an embedded store; the dashboard does not open it "
            f"itself. If `handoffs serve` owns it, use --store http://127.0.0.1:{port}.",
            file=sys.stderr,
        )
    print(
        f"Dashboard on http://{args.host}:{args.port} reading {_without_password(store)} "
        f"(database {env[settings.DATABASE.env]})",
        flush=True,
    )
    # Become streamlit (exec): signals (Ctrl-C, docker stop's SIGTERM) reach it directly and
    # no orphan is left behind when a supervisor stops this process.
    try:
        os.execve(argv[0], argv, env)
    except OSError as exc:
        print(f"handoffs dashboard: cannot start streamlit: {exc}", file=sys.stderr)
    return _EXIT_UNAVAILABLE


def register(sub: argparse._SubParsersAction) -> None:
    """Add `handoffs dashboard` to the `handoffs` parser."""
    p = sub.add_parser(
        "dashboard",
        help="run the Streamlit dashboard (read-only)",
        description="Run the Streamlit dashboard headless. It only reads the store: for an embedded "
        "store, point it at `handoffs serve`'s query port (http://127.0.0.1:8124).",
    )
    p.add_argument(
        "--store",
        default=None,
        help=f"store URL (env {settings.STORE.env}); e.g. http://127.0.0.1:8124: the read token "
        "of a serve of this user on this machine is found by itself; another token as the "
        f"password (http://reader:TOKEN@127.0.0.1:8124) or as {settings.PASSWORD.env}",
    )
    p.add_argument(
        "--database",
        default=None,
        help=f"database name (env {settings.DATABASE.env}, default handoffs)",
    )
    p.add_argument(
        "--rules",
        default=None,
        metavar="FILE",
        help=f"SLO rules file the Alerts page evaluates (env {settings.SLO_RULES.env}, default "
        f"{settings.SLO_RULES.default}; schema: docs/alerts.md)",
    )
    p.add_argument("--port", type=int, default=8501, help="port to serve the app on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.set_defaults(func=_run)
