"""Shared fixtures.

chDB lets one process open only ONE data path in its lifetime, so the whole test session
shares one embedded path and each test gets its own database (`fresh_db`). Tests that need a
second path run chDB in a subprocess (e.g. `handoffs serve`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from handoffs.store import StoreSpec, apply_schema, connect


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb-session")


@pytest.fixture(scope="session")
def chdb_client(chdb_path: Path):
    """One clickhouse-connect chDB client on the session-wide path (no default database)."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    client = connect(spec, database="")
    yield client
    client.close()


@pytest.fixture
def fresh_db(chdb_client) -> str:
    """A new database with the full schema applied; returns its name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    apply_schema(chdb_client, name)
    yield name
    if not os.environ.get("HANDOFFS_KEEP_TEST_DBS"):
        chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")
