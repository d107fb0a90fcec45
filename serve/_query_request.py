"""One HTTP request to serve's query port, decoded into a `QueryRequest`. Pure.

Every form clickhouse-connect (and curl) sends, as ClickHouse's HTTP interface reads them:

- the SQL in the `query` URL parameter (GET or POST), in the POST body, or both (the URL
  part first, then a newline, then the body);
- `multipart/form-data` (clickhouse-connect's form when the bound parameters pass ~4 KB):
  the `query` field and `param_<name>` fields; other fields are read like URL parameters;
- a body under `Content-Encoding` gzip, deflate, zstd or lz4 (decompressed up to the body
  limit, so a small bomb cannot grow past it);
- `param_<name>` values are passed to the engine as sent (ClickHouse's escaped text);
  other parameters that are not transport parameters are settings.

Refused with `RequestError`: external data (form files), ClickHouse-native compression
(`compress=1` / `decompress=1`), text that is not UTF-8, an unknown Content-Encoding.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, urlsplit

__all__ = ["TRANSPORT_PARAMS", "QueryRequest", "RequestError", "decode_request"]

#: URL parameters that shape the HTTP exchange, not the query: never passed on as settings.
TRANSPORT_PARAMS: Final = frozenset(
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
        "http_response_headers",
        # readonly is pinned by the port; a client's value is not a setting for it to apply
        "readonly",
    }
)
_BOUNDARY: Final = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.I)
_DISPOSITION_PARAM: Final = re.compile(
    r';\s*([A-Za-z*]+)="((?:[^"\\]|\\.)*)"|;\s*([A-Za-z*]+)=([^;\s]+)'
)


class RequestError(Exception):
    """A request the port cannot take: HTTP `status`, ClickHouse error `code`, `message`."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """What a request asks: the SQL text, bound parameters (name -> escaped text value),
    settings (name -> text), the database and default output format (None: the port's),
    and the client's query id (None: none sent)."""

    sql: str
    params: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    database: str | None = None
    default_format: str | None = None
    query_id: str | None = None


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(
            400, 62, f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _bounded(
    decompress: Callable[[bytes, int], bytes], data: bytes, limit: int, name: str
) -> bytes:
    try:
        out = decompress(data, limit + 1)
    except RequestError:
        raise
    except Exception as exc:  # each codec raises its own error type on corrupt input
        raise RequestError(400, 354, f"cannot decompress the {name} body: {exc}") from None
    if len(out) > limit:
        raise RequestError(413, 62, f"query body too large: over {limit} bytes once decompressed")
    return out


def _zlib(wbits: int) -> Callable[[bytes, int], bytes]:
    def run(data: bytes, max_length: int) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data, max_length)
        if len(out) < max_length and not d.eof:
            raise ValueError("truncated stream")
        return out

    return run


def _zstd(data: bytes, max_length: int) -> bytes:
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
    except ImportError:
        from backports import zstd  # type: ignore[no-redef]
    d = zstd.ZstdDecompressor()
    out: bytes = d.decompress(data, max_length=max_length)
    return out


def _lz4(data: bytes, max_length: int) -> bytes:
    import lz4.frame

    out: bytes = lz4.frame.LZ4FrameDecompressor().decompress(data, max_length=max_length)
    return out


_DECODERS: Final[dict[str, Callable[[bytes, int], bytes]]] = {
    "gzip": _zlib(31),
    "x-gzip": _zlib(31),
    "deflate": _zlib(47),  # zlib-wrapped (what HTTP calls deflate) or a gzip stream
    "zstd": _zstd,
    "lz4": _lz4,
}


def decode_body(data: bytes, encoding: str | None, limit: int) -> bytes:
    """`data` with its Content-Encoding undone, at most `limit` bytes (RequestError 413
    past it, 400 when corrupt, 415 for an encoding the port does not know)."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last one listed was applied last
        if coding == "identity":
            continue
        run = _DECODERS.get(coding)
        if run is None:
            raise RequestError(
                415,
                1001,
                f"Content-Encoding {coding!r} is not supported; use one of {sorted(_DECODERS)}",
            )
        data = _bounded(run, data, limit, coding)
    return data


def _disposition(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in _DISPOSITION_PARAM.finditer(value):
        key = (m.group(1) or m.group(3)).lower()
        out[key] = m.group(2).replace('\\"', '"') if m.group(1) else m.group(4)
    return out


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes, bool]]:
    """The parts of a multipart/form-data body as (field name, value bytes, is a file).

    Raises RequestError(400) on a body that does not follow the boundary it declares.
    """
    m = _BOUNDARY.search(content_type)
    if not m:
        raise RequestError(400, 62, "multipart/form-data without a boundary")
    delim = b"--" + (m.group(1) or m.group(2)).encode("latin-1")
    chunks = body.split(delim)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise RequestError(400, 62, "malformed multipart/form-data body: no closing boundary")
    parts: list[tuple[str, bytes, bool]] = []
    for chunk in chunks[1:-1]:
        if not chunk.startswith(b"\r\n") or not chunk.endswith(b"\r\n"):
            raise RequestError(400, 62, "malformed multipart/form-data body: bad part framing")
        head, sep, value = chunk[2:-2].partition(b"\r\n\r\n")
        if not sep:
            raise RequestError(400, 62, "malformed multipart/form-data body: a part has no headers")
        headers = {}
        for line in _utf8(head, "a multipart header").split("\r\n"):
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        disp = _disposition(headers.get("content-disposition", ""))
        if "name" not in disp:
            raise RequestError(400, 62, "malformed multipart/form-data body: a part has no name")
        parts.append((disp["name"], value, "filename" in disp))
    return parts


def _pairs(query: str) -> list[tuple[str, str]]:
    try:
        return parse_qsl(query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise RequestError(400, 62, "a URL parameter is not valid UTF-8") from None


def decode_request(
    method: str, target: str, headers: Mapping[str, str], body: bytes, *, max_body: int
) -> QueryRequest:
    """The QueryRequest of one request to the port (`target` is the request line's path
    and query string, `headers` its headers with lower-cased names, `body` the bytes read
    off the wire, at most `max_body` of them once decompressed).

    Raises RequestError: 404 for a path other than `/`, 400 for an empty query or a form the
    port does not take, 413 past `max_body`, 415 for an unknown Content-Encoding.
    """
    parts = urlsplit(target)
    if parts.path not in ("/", ""):
        raise RequestError(404, 62, f"no handler for path {parts.path!r} (HTTP_HANDLER_NOT_FOUND)")
    fields = dict(_pairs(parts.query))
    for name in ("compress", "decompress"):
        if fields.get(name, "0") not in ("0", ""):
            raise RequestError(
                400,
                1001,
                f"{name}={fields[name]}: ClickHouse-native compression is not supported on the "
                "query port; use Accept-Encoding / Content-Encoding",
            )
    data = decode_body(body, headers.get("content-encoding"), max_body) if body else b""
    ctype = headers.get("content-type", "")
    if method == "POST" and ctype.split(";")[0].strip().lower() == "multipart/form-data":
        for name, value, is_file in parse_multipart(data, ctype):
            if is_file:
                raise RequestError(
                    400, 1001, f"external data ({name!r}) is not supported on the query port"
                )
            fields[name] = _utf8(value, f"form field {name!r}")
        sql = fields.get("query", "")
    else:
        text = _utf8(data, "the query body") if data else ""
        sql = "\n".join(s for s in (fields.get("query", ""), text) if s)
    if not sql.strip():
        raise RequestError(400, 62, "Empty query. (SYNTAX_ERROR)")
    return QueryRequest(
        sql=sql,
        params={k[6:]: v for k, v in fields.items() if k.startswith("param_")},
        settings={
            k: v
            for k, v in fields.items()
            if k not in TRANSPORT_PARAMS and not k.startswith("param_")
        },
        database=fields.get("database") or None,
        default_format=fields.get("default_format") or None,
        query_id=fields.get("query_id") or None,
    )
