"""OTLP/HTTP trace receiver: POST /v1/traces (protobuf or JSON, optionally gzip), GET /health
(`?wait_s=N`: answered once every acknowledged request is stored, or after N seconds).

Status codes follow the OTLP/HTTP spec: 200 (with partial_success when some spans were
rejected), 400 bad data, 401 missing/unknown bearer token, 404 unknown path, 411 no
Content-Length, 413 body over max_body_bytes (compressed or after gunzip), 415 unknown
Content-Type or Content-Encoding, 503 + Retry-After when the spool is full or the store is
failing. Error bodies are google.rpc.Status (protobuf or JSON, matching the request).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ingest._decode import JSON, PROTOBUF, DecodeError
from ingest._service import StoreUnavailable
from ingest._spool import SpoolFull

if TYPE_CHECKING:
    from ingest._service import Ingestor

__all__ = ["OtlpConfig", "make_otlp_server"]

log = logging.getLogger("handoffs.otlp")
_CONTENT_TYPES: Final = {
    "application/x-protobuf": PROTOBUF,
    "application/protobuf": PROTOBUF,
    "application/json": JSON,
}
_RPC_CODES: Final = {400: 3, 401: 16, 404: 5, 411: 3, 413: 8, 415: 3, 503: 14, 500: 13}
RETRY_AFTER_S: Final = 1
_DRAIN_MAX: Final = 256 * 1024 * 1024  # oversized bodies up to this are read and discarded


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """`tokens` maps bearer token -> tenant; empty means no auth and tenant 'default'."""

    max_body_bytes: int
    tokens: dict[str, str]
    default_tenant: str = "default"


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise _HttpError(400, f"body is not valid gzip: {exc}") from None
    if len(out) > limit:
        raise _HttpError(413, f"body exceeds {limit} bytes after gunzip")
    if not d.eof:
        raise _HttpError(400, "gzip body is truncated")
    return out


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
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, fmt: str) -> None:
        extra = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}
        if status in (401,):
            extra["WWW-Authenticate"] = 'Bearer realm="handoffs"'
        if status in (411, 413):
            self.close_connection = True  # the unread body must not be parsed as a request
            extra["Connection"] = "close"
        code = _RPC_CODES.get(status, 2)
        if fmt == PROTOBUF:
            body = status_pb2.Status(code=code, message=message).SerializeToString()
            self._send(status, body, "application/x-protobuf", extra)
        else:
            body = json.dumps({"code": code, "message": message}).encode()
            self._send(status, body, "application/json", extra)

    # -------------------------------------------------------------- routes

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/health":
            try:
                wait_s = _health_wait_s(query)
            except _HttpError as e:
                self._error(e.status, e.message, JSON)
                return
            if wait_s:
                self.ingestor.wait_idle(wait_s)
            h = self.ingestor.health()
            status = 200 if h["status"] == "ok" else 503
            self._send(status, json.dumps(h).encode(), "application/json")
            return
        self._error(404, f"no such path {self.path!r}; use POST /v1/traces or GET /health", JSON)

    def do_POST(self) -> None:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        fmt = _CONTENT_TYPES.get(ctype, JSON)
        try:
            if self.path.split("?")[0] != "/v1/traces":
                raise _HttpError(404, f"no such path {self.path!r}; OTLP traces go to /v1/traces")
            tenant = self._tenant()
            if ctype not in _CONTENT_TYPES:
                raise _HttpError(
                    415,
                    f"unsupported Content-Type {ctype or '(none)'!r}; "
                    "use application/x-protobuf or application/json",
                )
            with self.ingestor.receiving(fmt, _int_or_zero(self.headers.get("Content-Length"))):
                body = self._body()
                decoded = self.ingestor.submit(body, fmt, tenant=tenant)
        except _HttpError as exc:
            self._error(exc.status, exc.message, fmt)
            return
        except DecodeError as exc:
            self._error(400, str(exc), fmt)
            return
        except (SpoolFull, StoreUnavailable) as exc:
            self._error(503, str(exc), fmt)
            return
        except OSError as exc:  # the spool could not be written (disk full, I/O error)
            log.error("spool write failed: %s", exc)
            self._error(503, f"spool write failed, retry later: {exc.strerror or exc}", fmt)
            return
        except Exception as exc:  # never acknowledge what was not spooled
            log.exception("ingest failed")
            self._error(500, f"internal error: {exc}", fmt)
            return
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
        tokens = self.config.tokens
        if not tokens:
            return self.config.default_tenant
        auth = self.headers.get("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _HttpError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
        tenant = tokens.get(token.strip())
        if tenant is None:
            raise _HttpError(401, "unknown bearer token")
        return tenant

    def _body(self) -> bytes:
        limit = self.config.max_body_bytes
        length = self.headers.get("Content-Length")
        if length is None:
            raise _HttpError(411, "Content-Length is required")
        try:
            n = int(length)
        except ValueError:
            raise _HttpError(400, f"bad Content-Length {length!r}") from None
        if n > limit:
            # Read and discard a moderately oversized body so the client sees the 413 instead
            # of a reset while it is still sending; beyond that, just close the connection.
            if n <= _DRAIN_MAX:
                left = n
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    left -= len(chunk)
            raise _HttpError(413, f"body of {n} bytes exceeds the limit of {limit} bytes")
        data = self.rfile.read(n)
        if len(data) != n:
            raise _HttpError(400, f"body truncated: got {len(data)} of {n} bytes")
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc == "gzip":
            return _gunzip(data, limit)
        if enc in ("identity", ""):
            return data
        raise _HttpError(415, f"unsupported Content-Encoding {enc!r}; use gzip or none")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_otlp_server(
    host: str, port: int, ingestor: Ingestor, config: OtlpConfig
) -> ThreadingHTTPServer:
    """Bind the OTLP receiver (port 0 = any free port; see server.server_address)."""
    handler = type("OtlpHandler", (_Handler,), {"ingestor": ingestor, "config": config})
    return _Server((host, port), handler)
