"""OTLP/HTTP trace receiver: POST /v1/traces (protobuf or JSON, optionally gzip), GET /health
(`?wait_s=N`: answered once every acknowledged request is stored, or after N seconds).

Status codes follow the OTLP/HTTP spec: 200 (with partial_success when some spans were
rejected), 400 bad data or bad request_framing, 401 missing/unknown bearer token, 404 unknown path,
405 (with `Allow`) another method on a known path, 411 neither Content-Length nor chunked,
413 body over max_body_bytes (as sent, or after gunzip), 415 unknown Content-Type or
Content-Encoding, 503 + Retry-After when the spool is full, the store is failing, or (before
the body is decoded) `OtlpConfig.admit` refuses: too many parts (ingest._parts). Error
bodies are google.rpc.Status (protobuf or JSON, matching the request).

Bodies are read by foundation.http_body: a Content-Length or `Transfer-Encoding: chunked` (what
Node.js exporters send), read against the limit as they arrive. A gzip body may hold several
members; their concatenated output is the request. A refused request's body is discarded
(up to max_body_bytes) so the keep-alive connection stays in step; when that cannot be done
(bad framing, a body cut short, a larger one, 411, 413) the answer says `Connection: close`
and the connection is closed, after discarding up to 256 MiB so that a client which reads
only once it has sent everything sees the answer rather than a reset. A body is never
parsed as a request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from foundation.http_body import BodyError, BodyReader, Framing, gunzip, request_framing
from foundation.store import StoreUnavailable
from ingest._auth import Unauthenticated, tenant_for
from ingest._decode import JSON, PROTOBUF, DecodeError
from ingest._parts import TooManyParts
from ingest._spool import SpoolFull
from ingest._telemetry import Refusal, Telemetry, credential_label

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest._decode import DecodedBatch
    from ingest._service import Ingestor

__all__ = ["OtlpConfig", "make_otlp_server"]

log = logging.getLogger("handoffs.otlp")
_CONTENT_TYPES: Final = {
    "application/x-protobuf": PROTOBUF,
    "application/protobuf": PROTOBUF,
    "application/json": JSON,
}
_ENCODINGS: Final = {"": "identity", "identity": "identity", "gzip": "gzip", "x-gzip": "gzip"}
_RPC_CODES: Final = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 503: 14, 500: 13}
#: the methods each path answers; any other gets 405 naming them
_ROUTES: Final = {"/v1/traces": ("POST",), "/health": ("GET", "HEAD"), "/metrics": ("GET", "HEAD")}
#: the reason a refusal is counted under when the code path names none (by HTTP status)
_REASONS: Final = {
    400: "bad_request",
    401: "unauthenticated",
    404: "not_found",
    405: "method_not_allowed",
    411: "length_required",
    413: "too_large",
    415: "unsupported_media_type",
    500: "internal_error",
    503: "unavailable",
}
RETRY_AFTER_S: Final = 1
_DRAIN_MAX: Final = 256 * 1024 * 1024  # bytes of a refused body discarded before closing


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """`tokens` maps bearer token -> tenant; empty means no auth and tenant 'default'.
    `health_info`: fields the process adds to every /health answer (e.g. `query_auth`).
    `admit`: called before an export's body is read; raises TooManyParts to refuse it (503)."""

    max_body_bytes: int
    tokens: dict[str, str]
    default_tenant: str = "default"
    health_info: dict[str, str] = field(default_factory=dict)
    admit: Callable[[], None] | None = None


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.reason = reason


#: longest `GET /health?wait_s=` a caller may ask for (seconds)
HEALTH_MAX_WAIT_S: Final = 600.0


def _health_wait_s(query: str) -> float:
    """`wait_s` of a /health query string: answer once every acknowledged request is stored,
    or after that many seconds (0 or absent: at once). Anything else is a 400 that says why."""
    if not query:
        return 0.0
    try:
        params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise _HttpError(400, f"bad query string {query!r}; use /health?wait_s=SECONDS") from None
    unknown = sorted(set(params) - {"wait_s"})
    if unknown:
        raise _HttpError(400, f"unknown /health parameter(s) {unknown}; the only one is wait_s")
    values = params["wait_s"]
    try:
        wait_s = float(values[-1])
    except ValueError:
        wait_s = -1.0
    if len(values) != 1 or not 0 <= wait_s <= HEALTH_MAX_WAIT_S:
        raise _HttpError(
            400,
            f"wait_s must be one number of seconds from 0 to {HEALTH_MAX_WAIT_S:.0f}, got {values}",
        )
    return wait_s


class _Handler(BaseHTTPRequestHandler):
    server_version = "handoffs-serve"
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds a connection may sit idle mid-request (slow or stalled clients)
    ingestor: Ingestor
    config: OtlpConfig
    telemetry: Telemetry

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # -------------------------------------------------------------- responses

    def _send(
        self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(
        self,
        status: int,
        message: str,
        fmt: str,
        extra: dict[str, str] | None = None,
        *,
        reason: str = "",
    ) -> None:
        self.telemetry.refused(
            Refusal(
                "http",
                str(status),
                reason or _REASONS.get(status, "other"),
                message,
                client=f"{self.client_address[0]}:{self.client_address[1]}",
                user_agent=self.headers.get("User-Agent") or "",
                credential=self._credential(),
            )
        )
        extra = dict(extra or {})
        if status == 503:
            extra.setdefault("Retry-After", str(RETRY_AFTER_S))
        if status == 401:
            extra["WWW-Authenticate"] = 'Bearer realm="handoffs"'
        code = _RPC_CODES.get(status, 2)
        if fmt == PROTOBUF:
            body = status_pb2.Status(code=code, message=message).SerializeToString()
            self._send(status, body, "application/x-protobuf", extra)
        else:
            body = json.dumps({"code": code, "message": message}).encode()
            self._send(status, body, "application/json", extra)

    def _refuse(self, exc: _HttpError | BodyError, fmt: str, reader: BodyReader) -> None:
        """Answer a refusal so that what is left of the body is never read as a request: the
        rest discarded (the connection stays open), or the answer sent with Connection: close
        and then up to _DRAIN_MAX discarded (so a client still sending reads the answer)."""
        headers = exc.headers if isinstance(exc, _HttpError) else {}
        reason = exc.reason if isinstance(exc, _HttpError) else _body_reason(exc)
        # 411: a body sent without framing would be read as the next request. 413: the body
        # is over the limit, so not worth discarding to keep the connection (but see below).
        keep = exc.status != 411 and (
            reader.in_step or (exc.status != 413 and reader.drain(self.config.max_body_bytes))
        )
        if keep:
            self._error(exc.status, exc.message, fmt, headers, reason=reason)
            return
        self.close_connection = True
        self._error(exc.status, exc.message, fmt, headers, reason=reason)
        self.wfile.flush()
        with contextlib.suppress(OSError):  # the client went away: nothing left to protect
            reader.drain(_DRAIN_MAX)

    # -------------------------------------------------------------- routes

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        fmt = _CONTENT_TYPES.get(ctype, JSON) if path == "/v1/traces" else JSON
        try:
            fr = request_framing(self.headers)
        except BodyError as exc:  # where the body ends is unknown: answer and close
            self.close_connection = True
            self._error(exc.status, exc.message, fmt, reason="bad_framing")
            return
        reader = BodyReader(self.rfile, fr)
        try:
            allowed = _ROUTES.get(path)
            if allowed is None:
                raise _HttpError(
                    404, f"no such path {self.path!r}; use POST /v1/traces or GET /health"
                )
            if self.command not in allowed:
                raise _HttpError(
                    405,
                    f"method {self.command} is not allowed on {path}; use {' or '.join(allowed)}",
                    {"Allow": ", ".join(allowed)},
                )
            if path == "/health":
                self._health(query, reader)
            elif path == "/metrics":
                self._metrics(reader)
            else:
                self._traces(ctype, fmt, fr, reader)
        except (_HttpError, BodyError) as exc:
            self._refuse(exc, fmt, reader)
        except OSError as exc:  # the client stalled or went away mid-body: nothing to answer
            log.debug("%s: connection lost while reading the body: %s", self.address_string(), exc)
            self.close_connection = True
        except Exception as exc:  # never acknowledge what was not spooled
            log.exception("request failed")
            self.close_connection = True
            self._error(500, f"internal error: {exc}", fmt)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

    def _health(self, query: str, reader: BodyReader) -> None:
        wait_s = _health_wait_s(query)
        if not reader.in_step and not reader.drain(self.config.max_body_bytes):
            raise BodyError(413, f"a /health request body over {self.config.max_body_bytes} bytes")
        if wait_s:
            self.ingestor.wait_idle(wait_s)
        h = {
            **self.ingestor.health(),
            **self.config.health_info,
            "refused": self.telemetry.refusal_counts(),
        }
        status = 200 if h["status"] == "ok" else 503
        self._send(status, json.dumps(h).encode(), "application/json")

    def _metrics(self, reader: BodyReader) -> None:
        if not reader.in_step and not reader.drain(self.config.max_body_bytes):
            raise BodyError(413, f"a /metrics request body over {self.config.max_body_bytes} bytes")
        page, ctype = self.telemetry.exposition()
        self._send(200, page, ctype)

    def _credential(self) -> str:
        """The credential the request showed, as logs may name it (never the token)."""
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            return "none"
        return credential_label(token.strip(), self.config.tokens)

    def _traces(self, ctype: str, fmt: str, fr: Framing, reader: BodyReader) -> None:
        tenant = self._tenant()
        if ctype not in _CONTENT_TYPES:
            raise _HttpError(
                415,
                f"unsupported Content-Type {ctype or '(none)'!r}; "
                "use application/x-protobuf or application/json",
                reason="unsupported_content_type",
            )
        enc = (self.headers.get("Content-Encoding") or "").strip().lower()
        if enc not in _ENCODINGS:
            raise _HttpError(
                415,
                f"unsupported Content-Encoding {enc!r}; use gzip or none",
                reason="unsupported_content_encoding",
            )
        if not fr.declared:
            raise _HttpError(411, "Content-Length is required (or Transfer-Encoding: chunked)")
        if self.config.admit is not None:
            try:  # before reading and decoding: overload costs no decode
                self.config.admit()
            except TooManyParts as exc:
                raise _HttpError(
                    503, str(exc), {"Retry-After": str(exc.retry_after_s)}, reason="too_many_parts"
                ) from None
        limit = self.config.max_body_bytes
        with self.ingestor.receiving(fmt, fr.length):
            body = reader.read(limit)
            if _ENCODINGS[enc] == "gzip":
                body = gunzip(body, limit)
            decoded = self._submit(body, fmt, tenant, announce=fr.chunked)
        if decoded is not None:
            self._accepted(decoded, fmt)

    def _submit(self, body: bytes, fmt: str, tenant: str, *, announce: bool) -> DecodedBatch | None:
        """Spool one request; None when refused (the refusal is answered here)."""
        try:
            if announce:  # a chunked body's size is known only now
                with self.ingestor.receiving(fmt, len(body)):
                    return self.ingestor.submit(body, fmt, tenant=tenant)
            return self.ingestor.submit(body, fmt, tenant=tenant)
        except DecodeError as exc:
            self._error(400, str(exc), fmt, reason="undecodable")
        except SpoolFull as exc:
            self._error(503, str(exc), fmt, reason="spool_full")
        except StoreUnavailable as exc:
            self._error(503, str(exc), fmt, reason="store_unavailable")
        except OSError as exc:  # the spool could not be written (disk full, I/O error)
            log.error("spool write failed: %s", exc)
            self._error(
                503,
                f"spool write failed, retry later: {exc.strerror or exc}",
                fmt,
                reason="spool_write_failed",
            )
        except Exception as exc:  # never acknowledge what was not spooled
            log.exception("ingest failed")
            self._error(500, f"internal error: {exc}", fmt)
        return None

    def _accepted(self, decoded: DecodedBatch, fmt: str) -> None:
        self.telemetry.answered("http", "200")
        rejected = len(decoded.rejects)
        if fmt == PROTOBUF:
            resp = ExportTraceServiceResponse()
            if rejected:
                resp.partial_success.rejected_spans = rejected
                resp.partial_success.error_message = decoded.error_message()
            self._send(200, resp.SerializeToString(), "application/x-protobuf")
        else:
            out: dict[str, Any] = {}
            if rejected:
                out["partialSuccess"] = {
                    "rejectedSpans": str(rejected),
                    "errorMessage": decoded.error_message(),
                }
            self._send(200, json.dumps(out).encode(), "application/json")

    def _tenant(self) -> str:
        try:
            return tenant_for(
                self.headers.get("Authorization"), self.config.tokens, self.config.default_tenant
            )
        except Unauthenticated as exc:
            reason = "unknown_token" if str(exc).startswith("unknown") else "missing_token"
            raise _HttpError(401, str(exc), reason=reason) from None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def _body_reason(exc: BodyError) -> str:
    """The counted reason of a body the reader refused."""
    if exc.status == 413:
        return "too_large"
    if "gzip" in exc.message:
        return "bad_gzip"
    if "truncated" in exc.message:
        return "truncated_body"
    return "bad_framing"


def make_otlp_server(
    host: str,
    port: int,
    ingestor: Ingestor,
    config: OtlpConfig,
    *,
    telemetry: Telemetry | None = None,
) -> ThreadingHTTPServer:
    """Bind the OTLP receiver (port 0 = any free port; see server.server_address).

    `telemetry` counts answers and refusals and renders `GET /metrics`; serve passes the one
    its gRPC port shares. Without one, a new one watching `ingestor` is made.
    """
    if telemetry is None:
        telemetry = Telemetry()
        telemetry.watch(ingestor)
    handler = type(
        "OtlpHandler",
        (_Handler,),
        {"ingestor": ingestor, "config": config, "telemetry": telemetry},
    )
    return _Server((host, port), handler)
