"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pgcluster import PrivateCluster, private_cluster


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivateCluster]:
    """A PostgreSQL cluster of the module's own, which its tests may freeze."""
    with private_cluster() as cluster:
        yield cluster
