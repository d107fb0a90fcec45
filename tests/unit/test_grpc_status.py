"""The pure parts of the OTLP/gRPC receiver, with plain values: credential -> tenant, exception
-> gRPC status (and its google.rpc.Status / RetryInfo trailers), decoded batch -> response."""

from __future__ import annotations

import errno

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from foundation.store import StoreUnavailable
from ingest._auth import Unauthenticated, tenant_for
from ingest._decode import DecodedBatch, DecodeError, Reject
from ingest._otlp_grpc import (
    MAX_MESSAGE_CHARS,
    RETRY_INFO_KEY,
    STATUS_DETAILS_KEY,
    GrpcConfig,
    Refusal,
    export_response,
    refusal_for,
    rpc_status,
    tenant_from_metadata,
)
from ingest._spool import SpoolFull

TOKENS = {"tok-a": "acme", "tok-g": "globex"}


@pytest.mark.parametrize(
    ("authorization", "tenant"),
    [("Bearer tok-a", "acme"), ("bearer tok-g", "globex"), ("  BEARER   tok-a  ", "acme")],
)
def test_a_known_bearer_token_gives_its_tenant(authorization, tenant):
    assert tenant_for(authorization, TOKENS, "default") == tenant


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "missing bearer token"),
        ("", "missing bearer token"),
        ("Bearer", "missing bearer token"),
        ("Bearer   ", "missing bearer token"),
        ("Basic dG9rLWE=", "missing bearer token"),
        ("tok-a", "missing bearer token"),
        ("Bearer tok-x", "unknown bearer token"),
        ("Bearer acme", "unknown bearer token"),  # a tenant name is not a token
    ],
)
def test_no_or_an_unknown_credential_is_refused(authorization, message):
    with pytest.raises(Unauthenticated, match=f"^{message}"):
        tenant_for(authorization, TOKENS, "default")


def test_without_tokens_every_request_is_the_default_tenant():
    assert tenant_for(None, {}, "default") == "default"
    assert tenant_for("Bearer whatever", {}, "solo") == "solo"


def test_metadata_gives_the_first_authorization_entry():
    meta = (("user-agent", "x"), ("authorization", "Bearer tok-g"), ("authorization", "nope"))
    assert tenant_from_metadata(meta, TOKENS, "default") == "globex"
    assert tenant_from_metadata((("authorization", b"Bearer tok-a"),), TOKENS, "d") == "acme"
    with pytest.raises(Unauthenticated, match="missing"):
        tenant_from_metadata((("user-agent", "x"),), TOKENS, "default")


@pytest.mark.parametrize(
    ("exc", "code", "retry", "text"),
    [
        (Unauthenticated("unknown bearer token"), "UNAUTHENTICATED", None, "unknown bearer"),
        (DecodeError("not a valid OTLP request"), "INVALID_ARGUMENT", None, "not a valid"),
        (SpoolFull("spool holds 5 bytes"), "UNAVAILABLE", 1, "spool holds 5 bytes"),
        (StoreUnavailable("store is failing: x"), "UNAVAILABLE", 1, "store is failing"),
        (
            OSError(errno.ENOSPC, "No space left on device"),
            "UNAVAILABLE",
            1,
            "spool write failed, retry later: No space left on device",
        ),
        (KeyError("bug"), "INTERNAL", None, "internal error: 'bug'"),
    ],
)
def test_each_exception_maps_to_the_otlp_status(exc, code, retry, text):
    r = refusal_for(exc)
    assert (r.code.name, r.retry_after_s) == (code, retry)
    assert text in r.message


def _trailers(status) -> dict[str, bytes]:
    return dict(status.trailing_metadata)


def test_back_pressure_carries_retry_info_in_the_status_and_for_the_python_exporter():
    st = rpc_status(Refusal(grpc.StatusCode.UNAVAILABLE, "spool full", 1.5))
    assert (st.code, st.details) == (grpc.StatusCode.UNAVAILABLE, "spool full")
    assert list(_trailers(st)) == [STATUS_DETAILS_KEY, RETRY_INFO_KEY]
    status = status_pb2.Status.FromString(_trailers(st)[STATUS_DETAILS_KEY])
    assert (status.code, status.message) == (14, "spool full")
    (detail,) = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    assert (info.retry_delay.seconds, info.retry_delay.nanos) == (1, 500_000_000)
    assert error_details_pb2.RetryInfo.FromString(_trailers(st)[RETRY_INFO_KEY]) == info


def test_a_refusal_not_to_retry_has_no_retry_info_and_a_bounded_message():
    st = rpc_status(Refusal(grpc.StatusCode.INVALID_ARGUMENT, "x" * 10_000))
    assert list(_trailers(st)) == [STATUS_DETAILS_KEY]
    status = status_pb2.Status.FromString(_trailers(st)[STATUS_DETAILS_KEY])
    assert status.code == 3 and not status.details
    assert len(st.details) == len(status.message) == MAX_MESSAGE_CHARS


def test_response_has_partial_success_only_when_spans_were_rejected():
    assert export_response(DecodedBatch(tenant="t", spans=3)) == b""
    rejects = [Reject("a" * 32, "b" * 16, "attribute handoff.x must be int", "{}")]
    resp = ExportTraceServiceResponse.FromString(
        export_response(DecodedBatch(tenant="t", spans=3, rejects=rejects))
    )
    assert resp.partial_success.rejected_spans == 1
    assert "attribute handoff.x must be int" in resp.partial_success.error_message


@pytest.mark.parametrize(("field", "value"), [("max_message_bytes", 0), ("workers", 0)])
def test_config_refuses_nonsense(field, value):
    kw = {"max_message_bytes": 1 << 20, field: value}
    with pytest.raises(ValueError, match=field):
        GrpcConfig(**kw)
