"""How the dashboard reaches the store, read-only, without ever taking chDB's lock.

chDB locks its data directory to one process (an exclusive flock on `<dir>/status`) and a
process can open only one path in its lifetime. In embedded mode `handoffs serve` owns the
directory, so the dashboard reads through serve's ClickHouse HTTP query port. Given a
`chdb://` store the dashboard opens it only when THIS process already holds it (AppTest runs
the app inside the test process, which has the session path open); otherwise it explains
how to point it at serve. Nothing here imports Streamlit.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from foundation import settings
from foundation.store import StoreError, StoreSpec, StoreUnavailable, connect, parse_store

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["StoreTarget", "StoreUnavailable", "chdb_lock_holder", "open_client", "resolve_target"]


@dataclass(frozen=True, slots=True)
class StoreTarget:
    """Where the dashboard reads: the parsed store URL and the database name."""

    spec: StoreSpec
    database: str

    @property
    def key(self) -> str:
        """A stable string for cache keys (no password)."""
        where = self.spec.path if self.spec.embedded else self.spec.url
        return f"{self.spec.kind}:{where}/{self.database}"


def resolve_target(store: str | None = None, database: str | None = None) -> StoreTarget:
    """Parse the store (argument, then HANDOFFS_STORE, then default); StoreUnavailable if bad."""
    try:
        spec = parse_store(store, database=database)
    except StoreError as exc:
        raise StoreUnavailable(f"The store setting is invalid: {exc}") from exc
    return StoreTarget(spec=spec, database=spec.database)


def chdb_lock_holder(path: str | os.PathLike[str]) -> int | None:
    """PID holding chDB's lock on `path`, -1 if locked by an unknown holder, None if free.

    Probes with a non-blocking flock on `<path>/status` (released at once), then looks the
    holder up in /proc/locks (Linux); never opens chDB. A directory without a status file
    (never opened) is free.
    """
    status = Path(path) / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        inode = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return -1
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 6659 fe:00:2146593 0 EOF"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            try:
                return int(parts[4])
            except ValueError:
                return -1
    return -1


def _serve_hint(path: str | None) -> str:
    port = settings.resolve(settings.QUERY_PORT)
    return (
        f"Start `handoffs serve --store chdb://{path}` (or `handoffs demo`), then open the "
        f"dashboard on its query port: `handoffs dashboard --store http://127.0.0.1:{port}`."
    )


def open_client(target: StoreTarget, *, pid: int | None = None) -> Client:
    """A clickhouse-connect client on the target's database; StoreUnavailable with the reason.

    chdb:// targets open only when this process (`pid`, default os.getpid()) already holds
    the directory's lock. Checks that the database and its handoff table exist, so an empty
    or unprepared store is reported as such rather than as a query error later.
    """
    spec = target.spec
    if spec.embedded:
        holder = chdb_lock_holder(spec.path or ".")
        me = os.getpid() if pid is None else pid
        if holder is None:
            raise StoreUnavailable(
                f"The dashboard does not open the embedded store at {spec.path} itself: chDB lets "
                f"only one process open it, and that should be the ingest server. {_serve_hint(spec.path)}"
            )
        if holder != me:
            who = f"process {holder}" if holder > 0 else "another process"
            raise StoreUnavailable(
                f"The embedded store at {spec.path} is locked by {who} (chDB allows one process "
                f"per data directory). If that is `handoffs serve`, point the dashboard at its "
                f"query port instead. {_serve_hint(spec.path)}"
            )
    try:
        client = _connect_shared(spec)
    except StoreError as exc:
        hint = "" if spec.embedded else " Is `handoffs serve` (or the ClickHouse server) running?"
        if "AUTHENTICATION_FAILED" in str(exc) or "Code: 516" in str(exc):
            hint = (
                " The store refused the credential: give serve's read token (or the ClickHouse "
                f"password) as {settings.PASSWORD.env} or in the URL, "
                "--store http://reader:TOKEN@127.0.0.1:8124. A serve of this user on this "
                "machine is found without one; another's token is in its <store dir>/query-token."
            )
        raise StoreUnavailable(
            f"Cannot reach the store ({spec.describe()}): {_short(exc)}.{hint}"
        ) from exc
    try:
        # EXISTS, not system.tables: a tenant's read token on serve's query port sees no
        # system.tables rows (their row counts span every tenant); the name is a plain
        # identifier (parse_store checked it)
        rows = client.query(f"EXISTS TABLE `{target.database}`.handoff_transitions").result_rows
        found = rows[0][0]
    except Exception as exc:  # clickhouse-connect raises several types for one cause
        raise StoreUnavailable(
            f"The store ({spec.describe()}) did not answer a query: {_short(exc)}"
        ) from exc
    if not found:
        raise StoreUnavailable(
            f"The store ({spec.describe()}) has no database {target.database!r} with handoff tables yet. "
            "Start `handoffs serve` (it creates the schema) and send spans, or run `handoffs demo`."
        )
    return client


def _connect_shared(spec: StoreSpec) -> Client:
    """connect() for a client that every browser session shares: over HTTP without a
    ClickHouse session id, since a server refuses concurrent queries within one session."""
    return connect(spec, database="", session=False)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
