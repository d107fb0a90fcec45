"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def derive_serve(tmp_path_factory):
    """One `handoffs serve` with derivation every 0.25 s, shared by the derived-handoff tests
    (each reads its own time window, so their runs do not mix)."""
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("derive"), env={"HANDOFFS_DERIVE_EVERY_S": "0.25"})
    yield s
    s.stop()
