"""`handoffs ingest FILE...` (batch ingest of OTLP files)."""

from __future__ import annotations

import argparse


def register_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="ingest OTLP JSON / protobuf / JSON-lines files")
    p.add_argument("files", nargs="+")
