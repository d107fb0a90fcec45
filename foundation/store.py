"""Store access: one URL picks embedded chDB or a ClickHouse server, always via clickhouse-connect.

`chdb:///abs/dir` (or `chdb://./rel/dir`) opens the embedded engine in this process. chDB locks
its data directory to one process and lets a process open only one path in its lifetime, so
in embedded mode only `handoffs serve` opens it; every other process (dashboard, CLI) reaches
it through serve's query port as `http://127.0.0.1:8124`.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import clickhouse_connect

from foundation import read_token, settings, tenant_scope

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "SQL_DIR",
    "StoreError",
    "StoreSpec",
    "StoreUnavailable",
    "apply_schema",
    "connect",
    "engine_options",
    "insert_rows",
    "parse_store",
    "query_each",
    "schema_statements",
    "sibling",
    "split_sql",
    "store_locked",
    "tsv_rows",
]

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class StoreError(RuntimeError):
    """The store URL is malformed or the store cannot be reached."""


class StoreUnavailable(StoreError):
    """The store cannot be used now (unreachable, locked, failing writes, no schema yet); the
    message is meant for the user as shown. Readers exit 3 on it; serve answers 503."""


@dataclass(frozen=True, slots=True)
class StoreSpec:
    kind: str  # "chdb" | "http"
    path: str | None = None  # chdb data directory (absolute)
    url: str | None = None  # http(s)://host:port
    host: str | None = None
    port: int | None = None
    secure: bool = False
    username: str = "default"
    password: str = ""
    database: str = "handoffs"

    @property
    def embedded(self) -> bool:
        return self.kind == "chdb"

    def describe(self) -> str:
        return f"embedded chDB at {self.path}" if self.embedded else f"ClickHouse at {self.url}"


def parse_store(store: str | None = None, *, database: str | None = None) -> StoreSpec:
    """Parse a store URL (argument, then HANDOFFS_STORE, then default) into a StoreSpec.

    An http store on loopback without a password (URL, then HANDOFFS_PASSWORD) gets the
    read token this user's serve left for that port, if any (foundation.read_token).
    Raises StoreError naming what is wrong for an unknown scheme, a missing path or port,
    or a database name that is not a plain identifier.
    """
    raw = settings.resolve(settings.STORE, store)
    db = settings.resolve(settings.DATABASE, database)
    parts = urlsplit(raw)
    query = parse_qs(parts.query)
    if "database" in query:
        db = query["database"][0]
    if not _DB_NAME.match(db):
        raise StoreError(f"database name {db!r} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
    if parts.scheme == "chdb":
        path = (parts.netloc + parts.path) if parts.netloc in (".", "..", "~") else parts.path
        if parts.netloc and parts.netloc not in (".", "..", "~"):
            path = parts.netloc + parts.path
        if not path:
            raise StoreError(
                f"store {raw!r}: chdb store needs a directory, e.g. chdb:///var/lib/handoffs"
            )
        return StoreSpec(kind="chdb", path=str(Path(path).expanduser().resolve()), database=db)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise StoreError(f"store {raw!r}: missing host, e.g. http://127.0.0.1:8124")
        secure = parts.scheme == "https"
        port = parts.port or (8443 if secure else 8123)
        return StoreSpec(
            kind="http",
            url=f"{parts.scheme}://{parts.hostname}:{port}",
            host=parts.hostname,
            port=port,
            secure=secure,
            # percent-encoded in the URL (a token may hold ':', '@' or '/')
            username=unquote(parts.username or "") or settings.resolve(settings.USER),
            password=unquote(parts.password or "")
            or settings.resolve(settings.PASSWORD)
            or _local_read_token(parts.hostname, port),
            database=db,
        )
    raise StoreError(
        f"store {raw!r}: unknown scheme {parts.scheme!r}; use chdb:///abs/dir or http://host:port"
    )


def _local_read_token(host: str, port: int) -> str:
    """The read token a serve of this user on loopback host:port left for its readers
    (foundation.read_token), or ""."""
    from foundation.read_token import find_token

    return find_token(host, port) or ""


#: Server settings of the embedded engine (chDB connection-string options; the first
#: connection in a process starts the engine with them). One background merge at a time
#: (chDB's default: 2 threads queueing 2 merges each): each merge holds its parts' read and
#: compression buffers, four at once held 250-300 MB in serve. Under full ingest load the
#: one thread (at nice 10, see serve._tuning.MergePriority) lets parts pile up (34 per table
#: after 1,000,000 spans at ~46,000 spans/s) and merges them within seconds once load drops;
#: measured for 500,000 spans: peak RSS 567-603 MB instead of 628-657, same throughput.
ENGINE_OPTIONS: Final = {
    "background_merges_mutations_concurrency_ratio": "1",
    "background_pool_size": "1",
}


def engine_options(path: str, database: str) -> dict[str, str]:
    """The embedded engine's options for the store at `path` whose schema lives in `database`:
    ENGINE_OPTIONS and the config that puts the tenant row policies in force
    (foundation.tenant_scope; its files are written here, under the store). The first open
    in a process starts the engine with them; a later open of the same path reuses it."""
    statements = [stmt for _name, stmt in schema_statements(database)]
    config = tenant_scope.engine_config(path, database, statements)
    return {**ENGINE_OPTIONS, "config-file": str(config)}


def connect(
    spec: StoreSpec,
    *,
    database: str | None = None,
    settings_: dict | None = None,
    session: bool = True,
) -> Client:
    """Open a clickhouse-connect client on the spec. Raises StoreError when unreachable.
    An embedded store that this user's running serve holds is read through that serve's
    query port instead (foundation.read_token.serving_port), as the CLI beside a demo needs.

    `database` None uses spec.database (which must exist; see apply_schema); pass "" to
    connect without a default database. `session` False: over HTTP, no ClickHouse session
    id, so that several threads may query through the client at once (a server runs one
    query at a time per session); embedded, the engine has no sessions.
    """
    if spec.embedded and store_locked(spec.path or "."):
        # held by this user's running serve: read through its query port (and its token)
        port = read_token.serving_port(spec.path or ".")
        if port is not None:
            spec = parse_store(f"http://127.0.0.1:{port}", database=spec.database)
    db = spec.database if database is None else (database or None)
    try:
        if spec.embedded:
            Path(spec.path or ".").mkdir(parents=True, exist_ok=True)
            client = clickhouse_connect.get_client(
                interface="chdb",
                path=spec.path,
                database=db,
                settings=settings_,
                chdb_options=engine_options(spec.path or ".", spec.database),
            )
        else:
            client = clickhouse_connect.get_client(
                host=spec.host,
                port=spec.port,
                secure=spec.secure,
                username=spec.username,
                password=spec.password,
                database=db,
                settings=settings_,
                connect_timeout=5,
                send_receive_timeout=120,
                autogenerate_session_id=None if session else False,
            )
    except Exception as exc:  # clickhouse-connect raises several types; one message for users
        raise StoreError(f"cannot open {spec.describe()}: {exc}") from exc
    _OPENED[client] = (spec, database, settings_)
    return client


#: how connect() opened each client it returned (for sibling())
_OPENED: weakref.WeakKeyDictionary[Client, tuple[StoreSpec, str | None, dict | None]] = (
    weakref.WeakKeyDictionary()
)
_SIBLINGS: weakref.WeakKeyDictionary[Client, Client] = weakref.WeakKeyDictionary()
_SIBLINGS_LOCK = threading.Lock()


def sibling(client: Client) -> Client | None:
    """A second client on the same store as `client`, opened once and kept while `client`
    lives, for queries run alongside its own (see query_each); None when connect() did not
    open `client` or the second connection fails. Embedded, it is another handle of the same
    engine (~12 ms to open); over HTTP it sends no session id, since a server runs one query
    at a time per session."""
    with _SIBLINGS_LOCK:
        if client in _SIBLINGS:
            return _SIBLINGS[client]
        how = _OPENED.get(client)
        if how is None:
            return None
        spec, database, settings_ = how
        try:
            other = connect(spec, database=database, settings_=settings_, session=False)
        except StoreError:
            return None
        _SIBLINGS[client] = other
        return other


def query_each(client: Client, jobs: Sequence[Callable[[Client], Any]]) -> list[Any]:
    """Run every job (a function of a client: its queries) and return their results in
    order: on `client` and, when it has one, on its sibling() at the same time, each
    taking the next job as it finishes one (give the longest first). Queries are analysed,
    planned and read on the engine's threads, so two at once use both cores of a small
    machine where one query of a few milliseconds' reading keeps one busy. The first
    exception a job raised is raised once every running job has ended."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    lock = threading.Lock()
    todo = iter(range(len(jobs)))

    def work(c: Client) -> None:
        while True:
            with lock:
                if errors:
                    return
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = jobs[i](c)
            except BaseException as exc:  # raised by the caller's thread below
                with lock:
                    errors.append(exc)
                return

    other = sibling(client) if len(jobs) > 1 else None
    helper = None
    if other is not None:
        helper = threading.Thread(target=work, args=(other,), name="store-query", daemon=True)
        helper.start()
    work(client)
    if helper is not None:
        helper.join()
    if errors:
        raise errors[0]
    return results


def schema_statements(database: str, *, cluster: str | None = None) -> list[tuple[str, str]]:
    """[(file name, statement)] of the numbered DDL, with {db} (and {cluster}) filled in.

    Files are `sql/NNN_name.sql` (or `sql/cluster/NNN_name.sql` when `cluster` is given);
    statements are separated by lines holding only `;`-terminated SQL. Comments stay in.
    """
    folder = SQL_DIR / "cluster" if cluster else SQL_DIR
    out: list[tuple[str, str]] = []
    for f in sorted(folder.glob("[0-9][0-9][0-9]_*.sql")):
        text = f.read_text().replace("{db}", database)
        if cluster:
            text = text.replace("{cluster}", cluster)
        for stmt in split_sql(text):
            out.append((f.name, stmt))
    return out


def split_sql(text: str) -> list[str]:
    """Split on `;` at end of line, ignoring `--` comment lines (DDL here has no `;` in strings)."""
    stmts, cur = [], []
    for line in text.splitlines():
        cur.append(line)
        if line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            stmt = "\n".join(cur).strip().rstrip(";").strip()
            if any(ln.strip() and not ln.strip().startswith("--") for ln in stmt.splitlines()):
                stmts.append(stmt)
            cur = []
    tail = "\n".join(cur).strip()
    if any(ln.strip() and not ln.strip().startswith("--") for ln in tail.splitlines()):
        stmts.append(tail)
    return stmts


def apply_schema(client: Client, database: str) -> list[str]:
    """Create the database and apply every numbered DDL file not yet recorded; idempotent.

    Returns the file names applied in this call. The `schema_version` table records each
    file once it applied completely; every statement is IF NOT EXISTS, so a crash between
    statements is repaired by applying the file again.
    """
    if not _DB_NAME.match(database):
        raise StoreError(f"database name {database!r} is not a plain identifier")
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_version "
        "(file String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY file"
    )
    done = {r[0] for r in client.query(f"SELECT file FROM {database}.schema_version").result_rows}
    applied: list[str] = []
    by_file: dict[str, list[str]] = {}
    for name, stmt in schema_statements(database):
        by_file.setdefault(name, []).append(stmt)
    for name, stmts in by_file.items():
        if name in done:
            continue
        for stmt in stmts:
            client.command(stmt)
        insert_rows(client, f"{database}.schema_version", ["file"], [[name]])
        applied.append(name)
    return applied


def store_locked(path: str) -> bool:
    """True when another process holds the embedded store's lock (ClickHouse flocks `status`)."""
    import fcntl

    status = Path(path) / "status"
    if not status.exists():
        return False
    with open(status, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


_TSV_ESCAPES: Final = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def _tsv_value(v: object) -> str:
    if v is None:
        return "\\N"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, bytes | bytearray):  # every byte as \xHH: any binary value, FixedString
        return "".join(f"\\x{b:02x}" for b in v)
    if isinstance(v, str):
        return v.translate(_TSV_ESCAPES)
    raise TypeError(f"no TabSeparated text for {type(v).__name__} {v!r}")


def tsv_rows(rows: Sequence[Sequence[object]]) -> bytes:
    """Rows as ClickHouse TabSeparated text: None is NULL, bytes are escaped byte by byte, str
    escaped; times are passed as text ('YYYY-MM-DD hh:mm:ss.fff', the column's time zone).
    Pure."""
    return "".join("\t".join(_tsv_value(v) for v in r) + "\n" for r in rows).encode()


def insert_rows(
    client: Client, table: str, column_names: Sequence[str], rows: Sequence[Sequence[object]]
) -> None:
    """Insert a few rows as TabSeparated text. For the small writes of serve's threads
    (signed heads, ledger pieces, schema files): `client.insert` resolves pandas on its first
    call, which costs a process that never uses it ~0.5 s of CPU and ~40 MB of anonymous
    memory."""
    if rows:
        client.raw_insert(
            table, list(column_names), insert_block=tsv_rows(rows), fmt="TabSeparated"
        )
