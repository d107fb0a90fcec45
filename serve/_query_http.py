"""Read-only ClickHouse HTTP query endpoint over the embedded chDB engine (serve, loopback).

Enough of ClickHouse's HTTP interface for clickhouse-connect's HTTP client (query, query_df,
query_arrow, command, raw_query, its connect-time probes): the request forms of
serve._query_request (SQL in the URL and/or the body, multipart forms with bound
parameters, compressed bodies, GET), `database`, `default_format`, settings, GET /ping.
Every query runs on the real engine (serve._query_engine: checked by ClickHouse's parser
without running it, then run bounded on its own handle); only the transport is ours.

Bodies are read by foundation.http_body (Content-Length or chunked, at most MAX_QUERY_BODY
bytes). A body that cannot be read whole is answered with `Connection: close`, and what the
client still sends is discarded (up to _DRAIN_MAX bytes) so it reads the answer. A query the
client abandons (closes its connection) is cancelled. Errors answer HTTP 4xx/5xx with
`X-ClickHouse-Exception-Code` and a `Code: N. DB::Exception: ...` body.

With read tokens configured every query needs one (serve._query_policy.read_access): a
missing or unknown token is answered 401, code 516 (AUTHENTICATION_FAILED), and logged
without the token; a tenant's token reads only its tenant's rows. GET /ping stays open.
A connection that sends no complete request line and headers within HEADER_TIMEOUT_S
seconds (HANDOFFS_QUERY_HEADER_TIMEOUT_S) in all (however it trickles them; idle between two requests too) is closed; once a request is read, each read or write
of its body and answer may take BODY_TIMEOUT_S (the query itself runs unbounded by them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from foundation import settings
from foundation.http_body import BodyError, BodyReader, request_framing
from serve._query_engine import QueryEngine, QueryError
from serve._query_policy import Unauthorized, read_access
from serve._query_request import RequestError, decode_request

__all__ = ["MAX_QUERY_BODY", "QueryEngine", "make_query_server"]

log = logging.getLogger("handoffs.query")

#: Largest query body the read-only endpoint reads, bytes, before and after decompression
#: (queries are small; inserts are refused).
MAX_QUERY_BODY: Final = 16 * 1024 * 1024
_DRAIN_MAX: Final = 64 * 1024 * 1024  # bytes of a refused body discarded before closing
#: Longest request line, bytes: ClickHouse's default http_max_uri_size. clickhouse-connect's
#: command() puts every bound parameter in the URL, however large (the standard library's
#: own limit, 64 KiB, refused 5,000 ids).
MAX_URL_BYTES: Final = 1024 * 1024
_SYNTAX_CODE: Final = 62
_AUTH_CODE: Final = 516  # AUTHENTICATION_FAILED
#: Seconds a connection may take to send a request's line and headers (or stay idle
#: between two requests) before it is closed, unless serve is given another
#: (HANDOFFS_QUERY_HEADER_TIMEOUT_S).
HEADER_TIMEOUT_S: Final = float(settings.QUERY_HEADER_TIMEOUT_S.default)
#: Seconds one read of a request body or one write of an answer may wait on the client.
BODY_TIMEOUT_S: Final = 120.0


class _HeaderDeadlines:
    """Closes connections still sending a request's line and headers at their deadline.

    A socket timeout bounds each read, not their sum: a client sending a byte every few
    seconds would keep a connection (and its thread) forever. One thread, started on first
    use, shuts such connections down (the handler's read then ends); `watch` and `done`
    bracket the header phase of each request.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._cond = threading.Condition()
        self._deadlines: dict[socket.socket, float] = {}
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket) -> None:
        with self._cond:
            self._deadlines[sock] = time.monotonic() + self.seconds
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="query-header-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def done(self, sock: socket.socket) -> bool:
        """Stop watching `sock`; True if its deadline passed (it was shut down)."""
        with self._cond:
            return self._deadlines.pop(sock, None) is None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._deadlines:
                    self._cond.wait()
                now = time.monotonic()
                late = [s for s, t in self._deadlines.items() if t <= now]
                for sock in late:
                    del self._deadlines[sock]
                wait = min(self._deadlines.values(), default=now + self.seconds) - now
            for sock in late:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._cond:
                self._cond.wait(max(wait, 0.05))


class _LogLimit:
    """At most `burst` log lines per `window_s` seconds; says how many it held back."""

    def __init__(self, burst: int = 5, window_s: float = 10.0) -> None:
        self._burst, self._window = burst, window_s
        self._lock = threading.Lock()
        self._start = -window_s
        self._count = self._held = 0

    def take(self) -> int | None:
        """None: do not log; else how many lines were held back before this one."""
        with self._lock:
            now = time.monotonic()
            if now - self._start >= self._window:
                self._start, self._count = now, 0
            if self._count >= self._burst:
                self._held += 1
                return None
            self._count += 1
            held, self._held = self._held, 0
            return held


def _client_gone(sock: socket.socket) -> bool:
    """True once the client closed its end (the socket reads as EOF or fails); a socket
    with data waiting (a next request) is still connected."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _Handler(BaseHTTPRequestHandler):
    server_version = "handoffs-serve"
    protocol_version = "HTTP/1.1"
    # headers and body go out as two writes: without TCP_NODELAY the body waits for the
    # client's delayed ACK (~40 ms per answer)
    disable_nagle_algorithm = True
    engine: QueryEngine
    default_database: str
    tokens: Mapping[str, str]
    refusals: _LogLimit
    header_deadlines: _HeaderDeadlines
    header_timeout_s: float

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with a request line of up to MAX_URL_BYTES and the
        request line and headers bounded by `header_timeout_s` in all."""
        try:
            self.connection.settimeout(self.header_timeout_s)
            self.header_deadlines.watch(self.connection)
            try:
                ready = self._read_head()
            finally:
                late = self.header_deadlines.done(self.connection)
            if late:  # shut down mid-headers: what was read is no whole request
                self.close_connection = True
                return
            if not ready:
                return
            self.connection.settimeout(BODY_TIMEOUT_S)
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(
                    HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})"
                )
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            log.debug("%s: connection closed: no request within its time", self.address_string())
            self.close_connection = True

    def _read_head(self) -> bool:
        """Read the request line (up to MAX_URL_BYTES) and headers; False when there is no
        request to answer (already answered, or the connection ended)."""
        self.raw_requestline = self.rfile.readline(MAX_URL_BYTES + 1)
        if len(self.raw_requestline) > MAX_URL_BYTES:
            self.requestline = self.request_version = self.command = ""
            self.close_connection = True  # the rest of the line would be read as a request
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return False
        if not self.raw_requestline:
            self.close_connection = True
            return False
        return bool(self.parse_request())

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError as exc:  # the client went away (its query may have been cancelled)
            log.debug("%s: could not send the answer: %s", self.address_string(), exc)
            self.close_connection = True

    def _error(self, status: int, code: int, message: str, headers: dict[str, str]) -> None:
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        self._send(
            status,
            (text.rstrip() + " (version handoffs-serve)\n").encode(),
            {
                "Content-Type": "text/plain; charset=UTF-8",
                "X-ClickHouse-Exception-Code": str(code),
                **headers,
            },
        )

    def _handle(self) -> None:
        try:
            fr = request_framing(self.headers)
        except BodyError as exc:  # where the body ends is unknown: answer and close
            self.close_connection = True
            self._error(exc.status, _SYNTAX_CODE, exc.message, {"Connection": "close"})
            return
        reader = BodyReader(self.rfile, fr)
        try:
            body = reader.read(MAX_QUERY_BODY)
        except BodyError as exc:
            message = f"query body too large: {exc.message}" if exc.status == 413 else exc.message
            self.close_connection = True
            self._error(exc.status, _SYNTAX_CODE, message, {"Connection": "close"})
            self.wfile.flush()
            with contextlib.suppress(OSError):  # a client still sending reads the answer
                reader.drain(_DRAIN_MAX)
            return
        except OSError as exc:  # the client stalled or went away mid-body
            log.debug("%s: connection lost while reading the body: %s", self.address_string(), exc)
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        asks = dict(parse_qsl(parts.query, keep_blank_values=True))
        if self.command in ("GET", "HEAD") and parts.path in ("/ping", "/") and "query" not in asks:
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        self._query(body)

    do_GET = do_POST = do_HEAD = _handle

    def _unauthorized(self, exc: Unauthorized, qid: str) -> None:
        held = self.refusals.take()
        if held is not None:
            log.warning(
                "query port: refused %s from %s (user agent %r): %s%s",
                exc.credential or "a request without a read token",
                self.address_string(),
                self.headers.get("User-Agent", ""),
                exc.message,
                f" ({held} more refusals not logged)" if held else "",
            )
        user = self.headers.get("X-ClickHouse-User", "") or "default"
        self._error(
            401,
            _AUTH_CODE,
            f"{user}: Authentication failed: {exc.message}. (AUTHENTICATION_FAILED)",
            {"X-ClickHouse-Query-Id": qid, "WWW-Authenticate": 'Basic realm="handoffs-serve"'},
        )

    def _query(self, body: bytes) -> None:
        qid = str(uuid.uuid4())
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            access = read_access(headers, self.tokens)
        except Unauthorized as exc:
            self._unauthorized(exc, qid)
            return
        try:
            request = decode_request(
                self.command, self.path, headers, body, max_body=MAX_QUERY_BODY
            )
            qid = request.query_id or qid
            result = self.engine.run(
                request,
                database=self.default_database,
                client_gone=lambda: _client_gone(self.connection),
                access=access,
            )
        except (RequestError, QueryError) as exc:
            extra = exc.headers if isinstance(exc, QueryError) else {}
            self._error(exc.status, exc.code, exc.message, {"X-ClickHouse-Query-Id": qid, **extra})
            return
        except Exception as exc:
            log.exception("query failed")
            self._error(500, 1001, str(exc), {"X-ClickHouse-Query-Id": qid})
            return
        self._send(
            200,
            result.data,
            {
                "Content-Type": "application/octet-stream"
                if result.fmt in ("Native", "RowBinary", "Arrow", "ArrowStream", "Parquet")
                else "text/plain; charset=UTF-8",
                "X-ClickHouse-Format": result.fmt,
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
    host: str,
    port: int,
    engine: QueryEngine,
    *,
    database: str,
    tokens: Mapping[str, str] | None = None,
    header_timeout_s: float = HEADER_TIMEOUT_S,
) -> ThreadingHTTPServer:
    """Bind the read-only query endpoint (default database `database`). `tokens`: read
    token -> tenant (`*` = every tenant); none = every local client reads every tenant.
    `header_timeout_s`: seconds a connection has for a request's line and headers, in all."""
    handler = type(
        "QueryHandler",
        (_Handler,),
        {
            "engine": engine,
            "default_database": database,
            "tokens": dict(tokens or {}),
            "refusals": _LogLimit(),
            "header_deadlines": _HeaderDeadlines(header_timeout_s),
            "header_timeout_s": header_timeout_s,
        },
    )
    return _Server((host, port), handler)
