"""The Cassandra reader's planning, without a server: spans cut along the token map cover
every token exactly once and never straddle two owners, input partitions are runs of them, and
the CQL keeps the tenant filter on the server where Cassandra allows it (a normal relation
beside a token relation on a partition key column is refused: a DISTINCT key scan instead)."""

from __future__ import annotations

import itertools
import random

import pytest

from analytics.source_cassandra import (
    MAX_TOKEN,
    MIN_TOKEN,
    Span,
    partition_query,
    ring_spans,
    scan_queries,
    slices,
)
from analytics.source_cassandra import CassandraTarget as Target
from analytics.source_cassandra import token_ranges as equal_ranges


def _covers_once(spans: list[Span]) -> None:
    assert spans[0].lo == MIN_TOKEN and spans[0].first and spans[-1].hi == MAX_TOKEN
    assert all(a.hi == b.lo and not b.first for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("n", [1, 3, 7, 48, 200])
def test_spans_follow_the_ring_and_cover_every_token_once(n: int) -> None:
    rng = random.Random(n)
    ring = [rng.randint(MIN_TOKEN + 1, MAX_TOKEN - 1) for _ in range(48)]  # 3 nodes x 16 vnodes
    spans = ring_spans(ring)
    _covers_once(spans)
    runs = slices(spans, n)
    assert len(runs) == n
    flat = [s for run in runs for s in run]
    _covers_once(flat)
    # Locality: no span crosses a ring token, so each has one replica set.
    tokens = sorted(ring)
    for s in flat:
        assert not any(s.lo < t < s.hi for t in tokens), s


def test_a_split_span_keeps_its_replicas() -> None:
    spans = [Span(MIN_TOKEN, 0, True, ("10.0.0.1",)), Span(0, MAX_TOKEN, False, ("10.0.0.2",))]
    runs = slices(spans, 6)
    flat = [s for run in runs for s in run]
    _covers_once(flat)
    assert {s.replicas for s in flat if s.hi <= 0} == {("10.0.0.1",)}
    assert {s.replicas for s in flat if s.lo >= 0} == {("10.0.0.2",)}


def test_no_token_map_means_equal_slices() -> None:
    _covers_once(equal_ranges(5))
    assert len(equal_ranges(5)) == 5


def test_tenant_filter_goes_to_the_server() -> None:
    span = Span(-10, 10, False)
    # tenant outside the partition key: filtered by the replicas, one query per tenant
    ((q, v),) = scan_queries("ks", "t", ["a", "tenant"], ["shard"], span, ("acme",))
    assert 'token("shard") > %s AND token("shard") <= %s' in q
    assert q.endswith("AND tenant = %s ALLOW FILTERING") and v == (-10, 10, "acme")
    # tenant within a composite partition key: only keys are scanned, then matching partitions
    ((q, v),) = scan_queries("ks", "sessions", ["x"], ["tenant", "client_id"], span, ("acme",))
    assert q.startswith('SELECT DISTINCT "tenant","client_id" FROM "ks"."sessions" WHERE token(')
    assert "tenant =" not in q
    one = partition_query("ks", "sessions", ["x"], ["tenant", "client_id"])
    assert one == 'SELECT "x" FROM "ks"."sessions" WHERE "tenant" = %s AND "client_id" = %s'
    # no filter: the plain range scan, the first span including its lowest token
    ((q, v),) = scan_queries("ks", "t", ["a"], ["k"], Span(MIN_TOKEN, 0, True), None)
    assert 'token("k") >= %s' in q and "ALLOW FILTERING" not in q and v == (MIN_TOKEN, 0)


def test_scans_read_at_local_quorum_unless_told() -> None:
    assert Target(("h",), 9042, "ks", "t").consistency == "LOCAL_QUORUM"


def test_a_scan_at_serial_is_refused() -> None:
    from analytics.source import StarlingDataSource

    with pytest.raises(ValueError, match="SERIAL"):
        StarlingDataSource({"table": "sessions", "cassandra": "h", "consistency": "serial"})
    ds = StarlingDataSource({"table": "sessions", "cassandra": "h"})
    assert ds._cassandra_target().consistency == "LOCAL_QUORUM"
