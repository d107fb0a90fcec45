"""ingest.chdb reads clickhouse-connect internals only under the releases it was checked
against; any other is refused with a message naming both."""

from __future__ import annotations

import pytest

from ingest.chdb import UnsupportedClient, check_client_version


def test_the_pinned_release_and_its_patches_are_accepted():
    check_client_version("1.12.0")
    check_client_version("1.12.7")
    check_client_version()  # the installed one: pyproject pins a supported release


@pytest.mark.parametrize("version", ["1.11.3", "1.13.0", "2.12.0", "0.8"])
def test_another_release_is_refused_with_a_clear_message(version):
    with pytest.raises(UnsupportedClient, match=rf"clickhouse-connect {version} is installed"):
        check_client_version(version)
