"""OTLP/gRPC trace receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.

The same semantics as the OTLP/HTTP receiver (ingest._otlp_http): the tenant comes from the
bearer token in the `authorization` metadata (ingest._auth), the request is durable in the
spool before OK (Ingestor.submit), rejected spans are counted in `partial_success`. gzip
(grpc's message compression) is decompressed by grpc itself.

Status codes as the OTLP spec maps them ("OTLP/gRPC Response", "OTLP/gRPC Throttling"):
OK (with partial_success when some spans were rejected); UNAUTHENTICATED for a missing or
unknown token; INVALID_ARGUMENT for a message that is not an ExportTraceServiceRequest;
RESOURCE_EXHAUSTED (from grpc, without RetryInfo: not to be retried) for a message over
max_message_bytes, compressed or decompressed; UNAVAILABLE with a google.rpc.RetryInfo detail
when the spool is full or cannot be written (disk full) or the store is failing (back-pressure:
retry after RETRY_AFTER_S), or `GrpcConfig.admit` refuses (too many parts, ingest._parts:
retry after its own delay); INTERNAL for anything else. Never OK for what is not spooled.
"""

from __future__ import annotations

import errno
import logging
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceServicer

from foundation.store import StoreUnavailable
from ingest._auth import Unauthenticated, tenant_for
from ingest._decode import PROTOBUF, DecodeError
from ingest._otlp_http import RETRY_AFTER_S
from ingest._parts import TooManyParts
from ingest._spool import SpoolFull
from ingest._telemetry import Refusal as Refused
from ingest._telemetry import Telemetry, credential_label

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ingest._decode import DecodedBatch
    from ingest._service import Ingestor

__all__ = [
    "GrpcConfig",
    "GrpcReceiver",
    "Refusal",
    "RpcStatus",
    "export_response",
    "refusal_for",
    "rpc_status",
    "start_grpc_server",
    "tenant_from_metadata",
]

log = logging.getLogger("handoffs.otlp")

#: the service's full name and method, from the generated descriptor (one source of truth)
SERVICE: Final = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
METHOD: Final = "Export"
#: trailing metadata key of a google.rpc.Status (what grpc-status and Go clients read)
STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"
#: trailing metadata key of a bare google.rpc.RetryInfo: the OTel Python exporter reads the
#: retry delay from this key, not from the Status details
RETRY_INFO_KEY: Final = "google.rpc.retryinfo-bin"
#: status messages longer than this are cut: they travel twice in the trailers (grpc-message
#: and the Status detail), and clients refuse metadata over 8 KiB by default
MAX_MESSAGE_CHARS: Final = 1024
#: Export calls decoded and spooled at once. A call's thread is busy for its decode (CPU,
#: the GIL), its fsync (I/O) and any wait for the writer to make room (Ingestor.submit); 2
#: cores gain nothing from more. Calls beyond wait in grpc's queue, their bytes held back by
#: HTTP/2 flow control; each one running holds its message (up to max_message_bytes).
DEFAULT_WORKERS: Final = 8


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """`tokens` maps bearer token -> tenant (empty: no auth, `default_tenant`);
    `max_message_bytes` bounds a request before and after decompression (bytes);
    `workers` is the number of Export calls handled at once; `admit` is called before a
    call's message is submitted and raises TooManyParts to refuse it."""

    max_message_bytes: int
    tokens: dict[str, str] = field(default_factory=dict)
    default_tenant: str = "default"
    workers: int = DEFAULT_WORKERS
    admit: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes: must be >= 1, got {self.max_message_bytes}")
        if self.workers < 1:
            raise ValueError(f"workers: must be >= 1, got {self.workers}")


# ------------------------------------------------------------------------- pure parts


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is not OK: its gRPC code, a message for the client, and, for back-pressure,
    the seconds after which to retry (None: do not retry as is)."""

    code: grpc.StatusCode
    message: str
    retry_after_s: float | None = None
    reason: str = "internal_error"  # what /metrics counts it under (ingest._telemetry)


def tenant_from_metadata(
    metadata: Sequence[tuple[str, str | bytes]], tokens: Mapping[str, str], default_tenant: str
) -> str:
    """The tenant of a call from its invocation metadata (the first `authorization` entry).

    Raises Unauthenticated (see ingest._auth.tenant_for)."""
    value = next((v for k, v in metadata if k.lower() == "authorization"), None)
    if isinstance(value, bytes):  # only `-bin` keys carry bytes; be lenient all the same
        value = value.decode("utf-8", "replace")
    return tenant_for(value, tokens, default_tenant)


def refusal_for(exc: BaseException) -> Refusal:
    """The answer to an exception raised while authenticating or submitting a request."""
    if isinstance(exc, Unauthenticated):
        reason = "unknown_token" if str(exc).startswith("unknown") else "missing_token"
        return Refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc), reason=reason)
    if isinstance(exc, DecodeError):
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc), reason="undecodable")
    if isinstance(exc, SpoolFull):
        return Refusal(grpc.StatusCode.UNAVAILABLE, str(exc), RETRY_AFTER_S, "spool_full")
    if isinstance(exc, TooManyParts):
        return Refusal(grpc.StatusCode.UNAVAILABLE, str(exc), exc.retry_after_s, "too_many_parts")
    if isinstance(exc, StoreUnavailable):
        return Refusal(grpc.StatusCode.UNAVAILABLE, str(exc), RETRY_AFTER_S, "store_unavailable")
    if isinstance(exc, OSError):  # the spool could not be written (disk full, I/O error)
        detail = exc.strerror or str(exc)
        return Refusal(
            grpc.StatusCode.UNAVAILABLE,
            f"spool write failed, retry later: {detail}",
            RETRY_AFTER_S,
            "spool_write_failed",
        )
    return Refusal(grpc.StatusCode.INTERNAL, f"internal error: {exc}")


@dataclass(frozen=True, slots=True)
class RpcStatus(grpc.Status):
    """A non-OK status for `ServicerContext.abort_with_status`."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...] = ()


def rpc_status(refusal: Refusal) -> RpcStatus:
    """The status to answer a refusal with: its code and message (cut to MAX_MESSAGE_CHARS),
    and trailers holding the google.rpc.Status, with a RetryInfo detail (and the bare
    RetryInfo under RETRY_INFO_KEY) when the client should retry."""
    message = refusal.message[:MAX_MESSAGE_CHARS]
    status = status_pb2.Status(code=refusal.code.value[0], message=message)
    trailers: list[tuple[str, bytes]] = []
    if refusal.retry_after_s is not None:
        seconds, frac = divmod(refusal.retry_after_s, 1)
        info = error_details_pb2.RetryInfo(
            retry_delay=Duration(seconds=int(seconds), nanos=int(frac * 1e9))
        )
        detail = AnyProto()
        detail.Pack(info)
        status.details.append(detail)
        trailers.append((RETRY_INFO_KEY, info.SerializeToString()))
    trailers.insert(0, (STATUS_DETAILS_KEY, status.SerializeToString()))
    return RpcStatus(refusal.code, message, tuple(trailers))


def export_response(decoded: DecodedBatch) -> bytes:
    """The serialized ExportTraceServiceResponse: partial_success set only when spans were
    rejected (the spec wants it unset on full success)."""
    resp = trace_service_pb2.ExportTraceServiceResponse()
    if decoded.rejects:
        resp.partial_success.rejected_spans = len(decoded.rejects)
        resp.partial_success.error_message = decoded.error_message()
    return resp.SerializeToString()


# ------------------------------------------------------------------------- the server


class _TraceService(TraceServiceServicer):
    """Export on raw bytes: the message goes to Ingestor.submit as the client serialized it,
    as over HTTP. Parsing it into a Python message only to serialize it again would cost a
    copy and a pass over every span, and give a batch id (a hash of the bytes) different
    from the same request's over HTTP whenever the two serializations differ; and a message
    grpc failed to parse would be answered INTERNAL instead of INVALID_ARGUMENT."""

    def __init__(self, ingestor: Ingestor, config: GrpcConfig, telemetry: Telemetry) -> None:
        self.ingestor = ingestor
        self.config = config
        self.telemetry = telemetry

    def Export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            tenant = tenant_from_metadata(
                context.invocation_metadata(), self.config.tokens, self.config.default_tenant
            )
            if self.config.admit is not None:
                self.config.admit()
            with self.ingestor.receiving(PROTOBUF, len(request)):
                decoded = self.ingestor.submit(request, PROTOBUF, tenant=tenant)
        except Exception as exc:  # never OK for what was not spooled
            refusal = refusal_for(exc)
            if refusal.code == grpc.StatusCode.INTERNAL:
                log.exception("ingest failed")
            elif isinstance(exc, OSError):
                log.error("spool write failed: %s", exc)
            self._count(refusal, context)
            context.abort_with_status(rpc_status(refusal))
            raise  # abort_with_status raises; this is never reached
        self.telemetry.answered("grpc", "OK")
        return export_response(decoded)

    def _count(self, refusal: Refusal, context: grpc.ServicerContext) -> None:
        metadata = {k.lower(): v for k, v in context.invocation_metadata()}
        auth = metadata.get("authorization")
        scheme, _, token = (auth if isinstance(auth, str) else "").partition(" ")
        agent = metadata.get("user-agent")
        self.telemetry.refused(
            Refused(
                "grpc",
                refusal.code.name,
                refusal.reason,
                refusal.message,
                client=context.peer(),
                user_agent=agent if isinstance(agent, str) else "",
                credential=credential_label(token.strip(), self.config.tokens)
                if scheme.lower() == "bearer"
                else "none",
            )
        )


class GrpcReceiver:
    """A started OTLP/gRPC server. `port` is the bound port; `stop(grace_s)` refuses new
    calls at once and lets running ones finish for up to grace_s seconds, then cancels
    the rest (their clients get a retryable error; a request already spooled is stored
    all the same), returning when all are done."""

    def __init__(self, server: grpc.Server, host: str, port: int) -> None:
        self._server = server
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        """host:port as a gRPC target (IPv6 hosts in brackets)."""
        return _target(self.host, self.port)

    def stop(self, grace_s: float = 30.0) -> None:
        """Idempotent; blocks until the server has stopped (at most ~grace_s seconds)."""
        self._server.stop(grace_s).wait()


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def start_grpc_server(
    host: str,
    port: int,
    ingestor: Ingestor,
    config: GrpcConfig,
    *,
    telemetry: Telemetry | None = None,
) -> GrpcReceiver:
    """Bind `host:port` (0: any free port; see .port) and start serving TraceService/Export.

    `telemetry` counts answers and refusals (transport `grpc`); serve passes the one its
    HTTP port renders on /metrics. A message over the size limit is refused by grpc itself
    (RESOURCE_EXHAUSTED) before the service sees it, so it is not counted there.

    Raises OSError (EADDRINUSE) when the address cannot be bound. SO_REUSEPORT is off, which
    grpc turns on by default: a second serve on the same port must fail, not share it."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="otlp-grpc"),
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", config.max_message_bytes),
        ],
    )
    if telemetry is None:
        telemetry = Telemetry()
        telemetry.watch(ingestor)
    service = _TraceService(ingestor, config, telemetry)
    handler = grpc.unary_unary_rpc_method_handler(service.Export)  # bytes in, bytes out
    server.add_registered_method_handlers(SERVICE, {METHOD: handler})
    address = _target(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(errno.EADDRINUSE, f"cannot bind OTLP/gRPC to {address}: {exc}") from None
    server.start()
    return GrpcReceiver(server, host, bound)
