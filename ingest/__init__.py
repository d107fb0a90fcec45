"""OTLP/HTTP receiver, decoding and validation, spool, batch writer into ClickHouse, serve."""

from ingest.integrity import row_hash

__all__ = ["row_hash"]
