"""Bearer credential -> tenant, for every OTLP receiver of serve (HTTP and gRPC): one rule.

Pure: the receiver passes the `Authorization` header (HTTP) or `authorization` metadata
value (gRPC) it got, and answers 401 / UNAUTHENTICATED with the message of Unauthenticated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Unauthenticated", "tenant_for"]


class Unauthenticated(ValueError):
    """No bearer credential, or one that maps to no tenant; the message says which."""


def tenant_for(authorization: str | None, tokens: Mapping[str, str], default_tenant: str) -> str:
    """The tenant of a request with this `Authorization` value (`Bearer <token>`, the scheme
    in any case). With no tokens configured auth is off: `default_tenant`, whatever was sent.

    Raises Unauthenticated for a missing or non-bearer credential or an unknown token.
    """
    if not tokens:
        return default_tenant
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated(
            "missing bearer token: send 'authorization: Bearer <token>' (HTTP header or gRPC metadata)"
        )
    tenant = tokens.get(token)
    if tenant is None:
        raise Unauthenticated("unknown bearer token")
    return tenant
