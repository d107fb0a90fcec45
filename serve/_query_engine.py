"""The engine side of serve's read-only query port: check a statement without running it,
then run what was checked, bounded, on a handle no other request sees.

Per request, in one of `QueryLimits.concurrency` slots (a request that finds none free within
`queue_wait_s` is refused with 503 + Retry-After):

1. open a fresh chDB connection handle on the process's one engine (~0.2 ms), give it the
   port's limits and `readonly = 2`, and close it afterwards: whatever a request sets
   (URL settings, a SETTINGS clause) dies with its handle and never reaches another request;
2. `SELECT formatQuerySingleLine({q:String})`, the text passed as a bound parameter: ClickHouse's
   parser returns the one statement's canonical text, or refuses several statements, without
   executing anything;
3. check the canonical text (serve._sql_guard: one read-only statement, no INTO OUTFILE, its
   SETTINGS within serve._query_policy) and its `EXPLAIN AST` (table functions, functions
   that reach out);
4. for a reader bound to one tenant, bind the handle to the tenant (foundation.tenant_scope:
   the engine's row policies then filter every table of the schema first, ahead of the
   reader's PREWHERE and WHERE) and give it `additional_table_filters` from
   serve._query_policy.tenant_filters over the tables the engine has at that moment (the
   system tables and any table outside the schema); a non-system table without a row
   policy refuses the read (503) instead of running it unscoped;
5. apply the client's URL settings (checked the same way) and run the canonical text, named by
   a leading comment, while a watchdog thread cancels it (`KILL QUERY`) once the client goes
   away or `KILL_GRACE_S` after its time limit passes.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from foundation.tenant_scope import SCOPE_SETTING, scope_value
from serve._query_policy import (
    QueryLimits,
    ReadAccess,
    setting_problem,
    tenant_filters,
    valid_name,
)
from serve._query_request import QueryRequest
from serve._sql_guard import (
    SqlLexError,
    ast_problem,
    settings_clauses,
    split_format,
    statement_problem,
    tokens,
)

__all__ = ["KILL_GRACE_S", "QueryEngine", "QueryError", "QueryResult"]

log = logging.getLogger("handoffs.query")

#: Seconds past a query's time limit after which serve cancels it itself (the engine checks
#: its limit between blocks of rows; a slow block can overrun it).
KILL_GRACE_S: Final = 5.0
#: Seconds between two looks at the running queries' clients and deadlines.
POLL_S: Final = 0.1
_CODE: Final = re.compile(r"Code: (\d+)")
_FORMAT_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_DATABASE_NAME: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_TAG: Final = "/* handoffs-query {} */ "
_READONLY: Final = 164
_SYNTAX: Final = 62
_CONSTRAINT: Final = 452  # SETTING_CONSTRAINT_VIOLATION
_BUSY: Final = 202  # TOO_MANY_SIMULTANEOUS_QUERIES
_CANCELLED: Final = 394  # QUERY_WAS_CANCELLED
_UNAVAILABLE: Final = 497  # ACCESS_DENIED
#: EXPLAIN kinds and options that show storage statistics (rows, parts, granules of every
#: tenant): refused with a tenant's read token
_STATS_EXPLAIN: Final = frozenset({"ESTIMATE", "INDEXES", "PROJECTIONS"})
_LIST_TABLES: Final = (
    "SELECT t.database, t.name, groupArrayIf(c.name, c.name IN ('tenant', 'Tenant')), "
    "(t.database, t.name) IN (SELECT database, table FROM system.row_policies) "
    "FROM system.tables AS t LEFT JOIN "
    "(SELECT database, table, name FROM system.columns WHERE name IN ('tenant', 'Tenant')) AS c "
    "ON t.database = c.database AND t.name = c.table GROUP BY t.database, t.name "
    "FORMAT JSONCompactEachRow"
)
#: Databases of the engine's own tables: no row policy there, the engine filter reads every
#: table of them as empty for a tenant-bound reader but SCOPED_SYSTEM_TABLES (none of which
#: stores rows a PREWHERE could run on)
_ENGINE_DATABASES: Final = frozenset({"system", "information_schema", "INFORMATION_SCHEMA"})
#: Which tables the engine has, in one value: the table list is read again when it changes
_TABLES_FINGERPRINT: Final = (
    "SELECT concat(toString(count()), '-', toString(sum(cityHash64(database, name)))) "
    "FROM system.tables"
)
_ESCAPES: Final = str.maketrans(
    {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0", "\b": "\\b", "\f": "\\f"}
)


class QueryError(Exception):
    """A refused or failed query: ClickHouse error `code`, HTTP `status`, extra `headers`."""

    def __init__(
        self, code: int, message: str, status: int = 500, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.headers = headers or {}


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's answer: the engine's output bytes in output format `fmt`."""

    data: bytes
    fmt: str


def escaped(text: str) -> str:
    """`text` as ClickHouse's escaped format writes it: how a bound parameter's value is
    passed to the engine (a raw tab or newline would end the value)."""
    return text.translate(_ESCAPES)


def _refused(problem: str) -> QueryError:
    return QueryError(
        _READONLY, f"Cannot execute query in readonly mode: {problem}. (READONLY)", 403
    )


def _unscoped(tables: list[str]) -> QueryError:
    """A tenant-bound read refused because the engine runs without the tenant row policies
    on some of its tables (it was started without foundation.store.engine_options)."""
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return QueryError(
        _UNAVAILABLE,
        f"Code: {_UNAVAILABLE}. DB::Exception: the query port cannot keep a tenant's reader to "
        f"its rows: no tenant row policy on {shown}; tenant read tokens are refused until serve "
        "runs on an engine started with its row policies. (ACCESS_DENIED)",
        503,
    )


def _constrained(problem: str) -> QueryError:
    return QueryError(_CONSTRAINT, f"{problem}. (SETTING_CONSTRAINT_VIOLATION)", 403)


def _engine_error(exc: Exception) -> QueryError:
    msg = str(exc)
    i = msg.find("Code: ")
    msg = msg[i:] if i >= 0 else f"Code: 1001. DB::Exception: {msg}"
    m = _CODE.search(msg)
    code = int(m.group(1)) if m else 1001
    status = 403 if code == _READONLY else 400 if code == _SYNTAX else 500
    return QueryError(code, msg, status)


@dataclass(slots=True)
class _Running:
    deadline: float
    client_gone: Callable[[], bool] | None
    why: str = ""


class _Watchdog:
    """Cancels running queries whose client went away or whose deadline passed.

    One thread, started on the first query; it waits idle while nothing runs and looks
    every POLL_S seconds while something does. `kill(tag)` is called again on every look
    until the query ends (a KILL sent just before the query registered finds nothing).
    """

    def __init__(self, kill: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic):
        self._kill = kill
        self._clock = clock
        self._running: dict[str, _Running] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, tag: str, deadline: float, client_gone: Callable[[], bool] | None) -> None:
        with self._cond:
            self._running[tag] = _Running(deadline, client_gone)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="query-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def done(self, tag: str) -> str:
        """Stop watching `tag`; returns why it was cancelled ("" if it was not)."""
        with self._cond:
            entry = self._running.pop(tag, None)
        return entry.why if entry else ""

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._running and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                entries = list(self._running.items())
            now = self._clock()
            for tag, entry in entries:
                try:
                    if not entry.why and entry.client_gone is not None and entry.client_gone():
                        entry.why = "the client went away"
                    if not entry.why and now > entry.deadline:
                        entry.why = "it ran past its time limit"
                    if entry.why:
                        self._kill(tag)
                except Exception:  # keep watching the others
                    log.exception("query watchdog: could not check or cancel a query")
            with self._cond:
                if not self._closed:
                    self._cond.wait(POLL_S)


class QueryEngine:
    """Runs read-only queries on the chDB engine of this process (see the module doc).

    `limits` bound every query (default: QueryLimits(), i.e. the HANDOFFS_QUERY_* variables);
    `handles` overrides `limits.concurrency` (queries run at once).
    """

    def __init__(self, path: str, *, limits: QueryLimits | None = None, handles: int | None = None):
        import chdb

        self._connect = chdb.connect
        self._path = path
        self.limits = limits or QueryLimits()
        self.concurrency = handles if handles is not None else self.limits.concurrency
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._setup = "SET " + ", ".join(
            f"{k} = {v}" for k, v in self.limits.engine_settings().items()
        )
        self._admin: Any = None
        self._admin_lock = threading.Lock()
        self._watchdog = _Watchdog(self._kill)
        self._closed = False
        self._tables_lock = threading.Lock()
        self._tables_seen: tuple[str, list[tuple[str, str, frozenset[str], bool]]] | None = None

    def run(
        self,
        request: QueryRequest,
        *,
        database: str,
        client_gone: Callable[[], bool] | None = None,
        access: ReadAccess | None = None,
    ) -> QueryResult:
        """Check and run one read-only statement; returns its output bytes and format.

        `database` is used when the request names none; `client_gone` (polled while the
        query runs) returning True cancels it; `access` (default: every tenant) bounds what
        the query reads. Raises QueryError: 403 for a statement or
        setting the port refuses, 400 for a bad name, 503 when every slot stays busy for
        `limits.queue_wait_s`, 500 for an engine error (its ClickHouse code kept).
        """
        access = access or ReadAccess()
        problem = statement_problem(request.sql)
        if problem:
            raise _refused(problem)
        for name, value in request.settings.items():
            if not valid_name(name):
                raise QueryError(115, f"Unknown setting {name!r}. (UNKNOWN_SETTING)", 400)
            if problem := setting_problem(name, value, self.limits, scoped=access.scoped):
                raise _constrained(problem)
        for name in request.params:
            if not valid_name(name):
                raise QueryError(
                    457, f"Bad query parameter name {name!r}. (BAD_QUERY_PARAMETER)", 400
                )
        fmt = request.default_format or "TabSeparated"
        if not _FORMAT_NAME.match(fmt):
            raise QueryError(73, f"Unknown format {fmt!r}. (UNKNOWN_FORMAT)", 400)
        db = request.database or database
        if not _DATABASE_NAME.match(db):
            raise QueryError(81, f"Database {db!r} does not exist. (UNKNOWN_DATABASE)", 400)
        if not self._slots.acquire(timeout=self.limits.queue_wait_s):
            raise QueryError(
                _BUSY,
                f"Too many simultaneous queries: the query port runs {self.concurrency} at once "
                f"and none ended within {self.limits.queue_wait_s:g} s; retry later. "
                "(TOO_MANY_SIMULTANEOUS_QUERIES)",
                503,
                {"Retry-After": "1"},
            )
        try:
            return self._run(request, db, fmt, client_gone, access)
        finally:
            self._slots.release()

    def _run(
        self,
        request: QueryRequest,
        db: str,
        fmt: str,
        client_gone: Callable[[], bool] | None,
        access: ReadAccess,
    ) -> QueryResult:
        conn = self._connect(self._path)
        why = ""  # why the watchdog cancelled the query, if it did
        try:
            conn.query(self._setup, "TabSeparated")
            if access.tenant is not None:
                tables = self._tables(conn)
                if unscoped := sorted(
                    f"{d}.{t}" for d, t, _cols, policy in tables
                    if not policy and d not in _ENGINE_DATABASES
                ):  # fmt: skip
                    raise _unscoped(unscoped)
                conn.query(
                    f"SET {SCOPE_SETTING} = '{_quote(scope_value(access.tenant))}', "
                    "additional_table_filters = "
                    f"{tenant_filters([(d, t, c) for d, t, c, _p in tables], access.tenant)}",
                    "TabSeparated",
                )
            conn.query("SET readonly = 2", "TabSeparated")
            conn.query(f"USE `{db}`", "TabSeparated")
            canonical = (
                conn.query(
                    "SELECT formatQuerySingleLine({q:String})",
                    "RawBLOB",
                    params={"q": escaped(request.sql)},
                )
                .bytes()
                .decode("utf-8")
            )
            text, clause_fmt = self._check(conn, canonical, request.params, access)
            if request.settings:
                conn.query(
                    "SET " + ", ".join(f"{k} = '{_quote(v)}'" for k, v in request.settings.items()),
                    "TabSeparated",
                )
            tag = uuid.uuid4().hex
            deadline = time.monotonic() + self.limits.max_execution_s + KILL_GRACE_S
            self._watchdog.watch(tag, deadline, client_gone)
            try:
                res = conn.query(_TAG.format(tag) + text, clause_fmt or fmt, params=request.params)
            finally:
                why = self._watchdog.done(tag)
            data = res.bytes() or b""
        except QueryError:
            raise
        except Exception as exc:
            if why:
                raise QueryError(
                    _CANCELLED,
                    f"Code: {_CANCELLED}. DB::Exception: the query port cancelled the query: "
                    f"{why}. (QUERY_WAS_CANCELLED)",
                ) from None
            raise _engine_error(exc) from None
        finally:
            try:
                conn.close()
            except Exception:
                log.debug("error closing a query handle", exc_info=True)
        return QueryResult(data, clause_fmt or fmt)

    def _tables(self, conn: Any) -> list[tuple[str, str, frozenset[str], bool]]:
        """Every table of the engine as (database, table, its tenant columns, whether a row
        policy covers it), read again whenever the set of tables changed (the engine creates
        its log tables lazily)."""
        mark = conn.query(_TABLES_FINGERPRINT, "TabSeparatedRaw").bytes().decode().strip()
        with self._tables_lock:
            if self._tables_seen is not None and self._tables_seen[0] == mark:
                return self._tables_seen[1]
        rows = conn.query(_LIST_TABLES, "JSONCompactEachRow").bytes().decode()
        tables = [
            (d, t, frozenset(cols), bool(policy))
            for d, t, cols, policy in map(json.loads, rows.splitlines())
        ]
        mark_after = conn.query(_TABLES_FINGERPRINT, "TabSeparatedRaw").bytes().decode().strip()
        if mark_after == mark:  # else a table came meanwhile: use this list, keep none
            with self._tables_lock:
                self._tables_seen = (mark, tables)
        return tables

    def _check(
        self, conn: Any, canonical: str, params: dict[str, str], access: ReadAccess
    ) -> tuple[str, str | None]:
        """The canonical statement without its FORMAT clause, and that clause's format;
        raises QueryError when the port refuses the statement."""
        try:
            problem = statement_problem(canonical)
            text, clause_fmt = split_format(canonical)
            pairs = settings_clauses(text)
            head = list(
                itertools.takewhile(lambda t: t.upper not in ("SELECT", "WITH"), tokens(text))
            )
        except SqlLexError as exc:
            raise _refused(f"cannot read the canonical statement: {exc}") from None
        if problem:
            raise _refused(problem)
        explain = bool(head) and head[0].upper == "EXPLAIN"
        if access.scoped and explain and any(t.upper in _STATS_EXPLAIN for t in head):
            raise _refused(
                "with a tenant's read token EXPLAIN may show the query, its plan or its "
                "pipeline, not storage statistics (ESTIMATE, indexes, projections)"
            )
        if clause_fmt is not None and not _FORMAT_NAME.match(clause_fmt):
            raise QueryError(73, f"Unknown format {clause_fmt!r}. (UNKNOWN_FORMAT)", 400)
        for name, value in pairs:
            if problem := setting_problem(name, value, self.limits, scoped=access.scoped):
                raise _constrained(problem)
        ast = conn.query(f"EXPLAIN AST {text}", "TabSeparatedRaw", params=params)
        if problem := ast_problem(ast.bytes().decode("utf-8", "replace")):
            raise _refused(problem)
        return text, clause_fmt

    def _kill(self, tag: str) -> None:
        with self._admin_lock:
            if self._closed:
                return
            if self._admin is None:
                # The one handle without readonly: it only ever runs this KILL, with a tag
                # serve made (hex digits), to cancel a query serve started.
                self._admin = self._connect(self._path)
            self._admin.query(
                f"KILL QUERY WHERE startsWith(query, '{_TAG.format(tag)}') ASYNC", "TabSeparated"
            )

    def close(self) -> None:
        """Stop the watchdog and close the cancelling handle (running queries finish)."""
        self._watchdog.close()
        with self._admin_lock:
            self._closed = True
            if self._admin is not None:
                try:
                    self._admin.close()
                except Exception:
                    log.debug("error closing the query port's admin handle", exc_info=True)
                self._admin = None


def _quote(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("'", "\\'")
