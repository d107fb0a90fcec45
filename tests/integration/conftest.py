"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def derive_serve(tmp_path_factory):
    """A `handoffs serve` with derivation every 0.25 s for one derived-handoff test module
    (per module: an idle serve passing every 0.25 s would cost CPU for the rest of the run)."""
    from serve.testing import start_serve

    s = start_serve(tmp_path_factory.mktemp("derive"), env={"HANDOFFS_DERIVE_EVERY_S": "0.25"})
    yield s
    s.stop()
