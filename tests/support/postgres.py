"""The suite's PostgreSQL: one private cluster per test session (crew_testkit.postgres).

Missing PostgreSQL skips locally and fails in CI (`required_in_ci`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crew_testkit.postgres import PostgresCluster, PostgresMissing
from tests.support.ci import required_in_ci

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A running cluster for the whole session, stopped and removed at its end."""
    try:
        cluster = PostgresCluster.start()
    except PostgresMissing as exc:
        required_in_ci(str(exc))
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


def location_for(backend: str, request: pytest.FixtureRequest) -> str:
    """Where a test's store lives: `:memory:` (SQLite), or a fresh PostgreSQL schema."""
    if backend == "sqlite":
        return ":memory:"
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return cluster.new_schema()
