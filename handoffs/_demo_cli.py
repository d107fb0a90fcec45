"""CLI subcommands of ingest/ (filled by its issue)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add this area's subcommands to the `handoffs` parser."""
