"""Fixtures of the reliability suite: one authenticated serve per module (starting serve costs
seconds; the fuzz and security tests only read or add data, so they share one)."""

from __future__ import annotations

import pytest

from tests.reliability._helpers import TOKENS


@pytest.fixture(scope="module")
def module_serve(tmp_path_factory: pytest.TempPathFactory):
    """`handoffs serve` with two tenants' tokens (TOKENS) on a fresh embedded store."""
    from serve.testing import start_serve

    h = start_serve(tmp_path_factory.mktemp("rel-serve"), TOKENS)
    yield h
    h.stop()
