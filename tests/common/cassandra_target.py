"""The Cassandra cluster the contract tests run on, when one is configured:
STARLING_TEST_CASSANDRA=host:port (plus, from `starling store check`,
STARLING_TEST_CASSANDRA_KEYSPACE and STARLING_TEST_CASSANDRA_CONSISTENCY). Skipped, saying
why, without it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

REASON = "Cassandra contract run needs STARLING_TEST_CASSANDRA=host:port (no server here)"


@dataclass(frozen=True, slots=True)
class CassandraTarget:
    contact_points: list[str]
    port: int
    keyspace: str
    consistency: str


def cassandra_target() -> CassandraTarget:
    """The configured cluster; pytest.skip with the reason when there is none."""
    where = os.environ.get("STARLING_TEST_CASSANDRA", "")
    if not where:
        pytest.skip(REASON)
    host, _, port = where.partition(":")
    return CassandraTarget(
        contact_points=[host],
        port=int(port or 9042),
        keyspace=os.environ.get("STARLING_TEST_CASSANDRA_KEYSPACE", "starling_test"),
        consistency=os.environ.get("STARLING_TEST_CASSANDRA_CONSISTENCY", "ONE"),
    )
