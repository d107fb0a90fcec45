"""A store as it was before one schema file added a column to handoff_transitions: for the
tests that a store upgraded by apply_schema fills the column for its old rows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from foundation.store import apply_schema


@contextmanager
def store_before(client, db: str, *, file: str, column: str) -> Iterator[str]:
    """Database `{db}_old` with every schema file applied but `file` (its `column` of
    handoff_transitions dropped, its schema_version row deleted); dropped afterwards."""
    old = f"{db}_old"
    apply_schema(client, old)
    client.command(f"ALTER TABLE {old}.handoff_transitions DROP COLUMN {column}")
    client.command(
        f"ALTER TABLE {old}.schema_version DELETE WHERE file = '{file}' SETTINGS mutations_sync = 2"
    )
    try:
        yield old
    finally:
        client.command(f"DROP DATABASE IF EXISTS {old} SYNC")


def merge_transitions(client, db: str) -> None:
    """Merge handoff_transitions' parts (the column's mutation done with them)."""
    client.command(f"OPTIMIZE TABLE {db}.handoff_transitions FINAL SETTINGS mutations_sync = 2")
