"""Read-only ClickHouse HTTP query endpoint over the embedded chDB engine (serve, loopback).

Enough of ClickHouse's HTTP interface for clickhouse-connect's HTTP client (query, query_df,
query_arrow, command, raw_query, its connect-time probes): SQL from the `query` URL
parameter and/or the POST body, `database`, `default_format`, `param_<name>` server-side
parameters, other URL parameters as settings, GET /ping. Every query runs on the real engine
(a chDB connection handle in this process); only the transport is ours.

Read-only twice over: only SELECT / SHOW / DESCRIBE / EXISTS / WITH / EXPLAIN statements are
let through, and the engine handle runs with `readonly = 2`. Errors answer HTTP 500 (or 400)
with `X-ClickHouse-Exception-Code` and a `Code: N. DB::Exception: ...` body.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from ingest._sql_guard import ast_problem, statement_problem, strip_trailing_format

__all__ = ["QueryEngine", "make_query_server"]

log = logging.getLogger("handoffs.query")

_TRANSPORT_PARAMS: Final = frozenset(
    {
        "query",
        "database",
        "default_format",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "enable_http_compression",
        "cancel_http_readonly_queries_on_client_close",
        "client_protocol_version",
        "quota_key",
        "role",
        "user",
        "password",
        "http_wait_end_of_query",
        "readonly",
    }
)
_TRAILING_FORMAT: Final = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.I)
_SETTING_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CODE: Final = re.compile(r"Code: (\d+)")
_READONLY_CODE: Final = 164
_SYNTAX_CODE: Final = 62


class _ChError(Exception):
    def __init__(self, code: int, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class QueryEngine:
    """A small pool of chDB connection handles on the one engine this process hosts.

    Each handle runs `SET readonly = 2`; per-request settings are applied with SET and reset
    to DEFAULT afterwards while the handle's lock is held. A handle that raised is replaced
    by a fresh one (an engine error must not leave a half-read result on it).
    """

    def __init__(self, path: str, *, handles: int = 2) -> None:
        self._path = path
        self._pool: list[list[Any]] = [[threading.Lock(), self._open(), ""] for _ in range(handles)]
        self._next = 0
        self._pick = threading.Lock()

    def _open(self) -> Any:
        import chdb

        conn = chdb.connect(self._path)
        conn.query("SET readonly = 2", "TabSeparated")
        return conn

    def run(
        self,
        sql: str,
        fmt: str,
        *,
        database: str | None,
        params: dict[str, str],
        settings: dict[str, str],
    ) -> bytes:
        """Run one read-only statement; return the result bytes in `fmt` (or its FORMAT clause).

        Refuses (code 164, READONLY) anything `_sql_guard` does not let through.
        """
        problem = statement_problem(sql)
        if problem:
            raise _ChError(
                _READONLY_CODE, f"Cannot execute query in readonly mode: {problem}. (READONLY)", 403
            )
        for k in settings:
            if not _SETTING_NAME.match(k):
                raise _ChError(115, f"Unknown setting {k!r}. (UNKNOWN_SETTING)", status=400)
        with self._pick:
            slot = self._pool[self._next % len(self._pool)]
            self._next += 1
        with slot[0]:
            conn = slot[1]
            try:
                if database and database != slot[2]:
                    conn.query(f"USE `{database.replace('`', '')}`", "TabSeparated")
                    slot[2] = database
                ast = conn.query(
                    f"EXPLAIN AST {strip_trailing_format(sql)}", "TabSeparatedRaw", params=params
                )
                problem = ast_problem(ast.bytes().decode("utf-8", "replace"))
                if problem:
                    raise _ChError(
                        _READONLY_CODE,
                        f"Cannot execute query in readonly mode: {problem}. (READONLY)",
                        403,
                    )
                applied = []
                try:
                    for k, v in settings.items():
                        conn.query(f"SET {k} = '{_esc(v)}'", "TabSeparated")
                        applied.append(k)
                    res = conn.query(sql, fmt, params=params)
                finally:
                    for k in applied:
                        try:
                            conn.query(f"SET {k} = DEFAULT", "TabSeparated")
                        except Exception:
                            log.debug("could not reset setting %s", k)
            except _ChError:
                raise
            except Exception as exc:
                self._replace(slot)
                msg = str(exc)
                i = msg.find("Code: ")
                msg = msg[i:] if i >= 0 else f"Code: 1001. DB::Exception: {msg}"
                m = _CODE.search(msg)
                raise _ChError(int(m.group(1)) if m else 1001, msg) from None
        data = res.bytes() if hasattr(res, "bytes") else bytes(res)
        return data or b""

    def _replace(self, slot: list[Any]) -> None:
        try:
            slot[1].close()
        except Exception:
            log.debug("error closing a failed chdb handle", exc_info=True)
        slot[1], slot[2] = self._open(), ""

    def close(self) -> None:
        for lock, conn, _ in self._pool:
            with lock:
                try:
                    conn.close()
                except Exception:
                    log.debug("error closing chdb handle", exc_info=True)


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("'", "\\'")


def _decompress(data: bytes, encoding: str | None) -> bytes:
    if not encoding or encoding == "identity":
        return data
    from clickhouse_connect.driver._backend.httpcommon import decompress_response

    return decompress_response(data, encoding)


#: Largest query body the read-only endpoint reads (queries are small; inserts are refused).
MAX_QUERY_BODY = 16 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    server_version = "handoffs-serve"
    protocol_version = "HTTP/1.1"
    engine: QueryEngine
    default_database: str

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/ping", "/") and "query=" not in self.path:
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        self._query(b"")

    def do_POST(self) -> None:
        try:
            body = self._read_body()
        except ValueError as exc:
            # The body was not consumed whole: the connection cannot carry another request.
            self.close_connection = True
            self._send(
                413 if "too large" in str(exc) else 400,
                f"Code: {_SYNTAX_CODE}. DB::Exception: {exc}\n".encode(),
                {"Content-Type": "text/plain; charset=UTF-8", "Connection": "close"},
            )
            return
        self._query(_decompress(body, self.headers.get("Content-Encoding")))

    def _read_body(self) -> bytes:
        """The whole request body, Content-Length or chunked (clickhouse-connect streams
        inserts chunked); ValueError past MAX_QUERY_BODY bytes or on a malformed chunk.
        Reading it whole keeps a keep-alive connection in step even for refused queries."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                except ValueError:
                    raise ValueError("malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                if len(out) + size > MAX_QUERY_BODY:
                    raise ValueError(f"query body too large (limit {MAX_QUERY_BODY} bytes)")
                out += self.rfile.read(size)
                self.rfile.readline(1024)  # CRLF after each chunk
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_QUERY_BODY:
            raise ValueError(f"query body too large (limit {MAX_QUERY_BODY} bytes)")
        return self.rfile.read(n) if n else b""

    def _query(self, body: bytes) -> None:
        qid = ""
        try:
            parts = urlsplit(self.path)
            if parts.path not in ("/", ""):
                raise _ChError(
                    _SYNTAX_CODE,
                    f"no handler for path {parts.path!r} (HTTP_HANDLER_NOT_FOUND)",
                    404,
                )
            qs = dict(parse_qsl(parts.query, keep_blank_values=True))
            qid = qs.get("query_id") or str(uuid.uuid4())
            sql = "\n".join(s for s in (qs.get("query", ""), body.decode("utf-8")) if s)
            if not sql.strip():
                raise _ChError(_SYNTAX_CODE, "Empty query. (SYNTAX_ERROR)", 400)
            m = _TRAILING_FORMAT.search(sql)
            fmt = m.group(1) if m else qs.get("default_format") or "TabSeparated"
            params = {k[6:]: v for k, v in qs.items() if k.startswith("param_")}
            settings = {
                k: v
                for k, v in qs.items()
                if k not in _TRANSPORT_PARAMS and not k.startswith("param_")
            }
            data = self.engine.run(
                sql,
                fmt,
                database=qs.get("database") or self.default_database,
                params=params,
                settings=settings,
            )
        except _ChError as exc:
            text = (
                exc.message
                if exc.message.startswith("Code:")
                else f"Code: {exc.code}. DB::Exception: {exc.message}"
            )
            self._send(
                exc.status,
                (text.rstrip() + " (version handoffs-serve)\n").encode(),
                {
                    "Content-Type": "text/plain; charset=UTF-8",
                    "X-ClickHouse-Exception-Code": str(exc.code),
                    "X-ClickHouse-Query-Id": qid,
                },
            )
            return
        except Exception as exc:
            log.exception("query failed")
            self._send(
                500,
                f"Code: 1001. DB::Exception: {exc}\n".encode(),
                {"Content-Type": "text/plain", "X-ClickHouse-Exception-Code": "1001"},
            )
            return
        self._send(
            200,
            data,
            {
                "Content-Type": "application/octet-stream"
                if fmt == "Native"
                else "text/plain; charset=UTF-8",
                "X-ClickHouse-Format": fmt,
                "X-ClickHouse-Query-Id": qid,
                "X-ClickHouse-Timezone": "UTC",
                "X-ClickHouse-Server-Display-Name": "handoffs-serve",
                "X-ClickHouse-Summary": json.dumps(
                    {"read_rows": "0", "read_bytes": "0", "written_rows": "0"}
                ),
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_query_server(
    host: str, port: int, engine: QueryEngine, *, database: str
) -> ThreadingHTTPServer:
    """Bind the read-only query endpoint (default database `database`)."""
    handler = type("QueryHandler", (_Handler,), {"engine": engine, "default_database": database})
    return _Server((host, port), handler)
