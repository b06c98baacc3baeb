"""The Cassandra side of format `starling` (analytics/source.py): the ring split along the
cluster's token map, each range read from one of its own replicas, at LOCAL_QUORUM, with the
tenant filter applied by Cassandra where CQL allows it.

Consistency: every scan reads at `CassandraTarget.consistency`, LOCAL_QUORUM by default (the
driver's default, LOCAL_ONE, can miss a write a quorum accepted, and a job that decides to
delete from what it read must not). A decision that deletes re-reads its row at SERIAL (a
single-partition read: Cassandra refuses SERIAL over a token range), in the job.

Splitting: the token map's ring (every vnode token) cuts the Murmur3 range into ranges each
owned by one replica set; input partitions are runs of consecutive ranges (a range split
further when there are fewer ranges than partitions), and each range's query goes straight
to one of its live local replicas (`Session.execute(host=...)`), so the coordinator holds the
data. Without a token map (a driver that has none yet) the ring is cut in equal slices.

Tenant filter (= or IN), by where `tenant` sits in the table's key:
- the whole partition key (`users`, `rules`, ...): one partition read per tenant, no scan;
- part of a composite partition key (`sessions`, `queue_log`, ...): Cassandra refuses a
  normal relation beside a token relation on key columns, so each range is scanned for its
  partition keys only (`SELECT DISTINCT`), and only the matching partitions are read;
- any other column: `AND tenant = ? ALLOW FILTERING` per tenant, filtered by the replicas.
Time filters stay in the Arrow batches (source_arrow.apply), as every pushed filter does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from analytics.source_arrow import TENANT_COLUMN, BaseReader, apply, quote, tenant_filter, to_batch

SCAN_CONSISTENCY = "LOCAL_QUORUM"
FETCH_SIZE = 5000  # rows per page of a scan
MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1


@dataclass(frozen=True)
class CassandraTarget:
    hosts: tuple[str, ...]
    port: int
    keyspace: str
    table: str
    consistency: str = SCAN_CONSISTENCY

    def session(self) -> tuple[Any, Any]:
        """A cluster and session reading at `consistency`, rows as tuples, token aware."""
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
        from cassandra.query import tuple_factory

        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
            consistency_level=getattr(ConsistencyLevel, self.consistency),
            row_factory=tuple_factory,
        )
        cluster = Cluster(
            list(self.hosts), port=self.port, execution_profiles={EXEC_PROFILE_DEFAULT: profile}
        )
        return cluster, cluster.connect()


def cassandra_columns(target: CassandraTarget) -> list[tuple[str, str]]:
    cluster, _ = target.session()
    try:
        ks = cluster.metadata.keyspaces.get(target.keyspace)
        meta = ks.tables.get(target.table) if ks else None
        if meta is None:
            return []
        return [(c.name, str(c.cql_type).lower()) for c in meta.columns.values()]
    finally:
        cluster.shutdown()


@dataclass(frozen=True)
class Span:
    """Tokens t with lo < t <= hi (lo <= t on the ring's first span), and the addresses of
    the replicas that own them (empty: let the driver choose)."""

    lo: int
    hi: int
    first: bool
    replicas: tuple[str, ...] = ()


class TokenSlice(InputPartition):
    """One input partition: consecutive spans of the ring, of a table whose partition key
    is `key` (the reader needs it on the executor)."""

    def __init__(self, spans: tuple[Span, ...], key: tuple[str, ...]) -> None:
        super().__init__((spans, key))
        self.spans, self.key = spans, key


class TenantKeys(InputPartition):
    """One input partition: whole partitions of a table keyed by tenant alone."""

    def __init__(self, tenants: tuple[str, ...]) -> None:
        super().__init__(tenants)
        self.tenants = tenants


def ring_spans(ring: Sequence[int]) -> list[Span]:
    """The spans between the ring's tokens, each owned by one replica set; the whole range
    when there is no ring."""
    tokens = sorted(set(ring))
    if not tokens:
        return [Span(MIN_TOKEN, MAX_TOKEN, True)]
    spans = [Span(MIN_TOKEN, tokens[0], True)]
    spans += [Span(a, b, False) for a, b in itertools.pairwise(tokens)]
    if tokens[-1] < MAX_TOKEN:
        spans.append(Span(tokens[-1], MAX_TOKEN, False))  # owned by the first token's replicas
    return spans


def _split(span: Span, k: int) -> list[Span]:
    cuts = [span.lo + (span.hi - span.lo) * i // k for i in range(k + 1)]
    cuts[-1] = span.hi
    out = [
        Span(a, b, span.first and i == 0, span.replicas)
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ]
    return [s for s in out if s.hi > s.lo or (s.first and s.hi == s.lo)]


def slices(spans: Sequence[Span], n: int) -> list[tuple[Span, ...]]:
    """`spans` in n runs of consecutive spans (each span split when there are fewer spans
    than n); every token in exactly one span of one run."""
    spans = list(spans)
    if len(spans) < n:
        k = -(-n // len(spans))
        spans = [piece for s in spans for piece in _split(s, k)]
    n = min(n, len(spans))
    return [tuple(spans[len(spans) * i // n : len(spans) * (i + 1) // n]) for i in range(n)]


def token_ranges(n: int) -> list[Span]:
    """The Murmur3 ring in n contiguous, equal spans (no token map)."""
    return [s for run in slices(ring_spans([]), n) for s in run]


def scan_queries(
    keyspace: str, table: str, names: Sequence[str], key: Sequence[str], span: Span,
    tenants: tuple[str, ...] | None,
) -> list[tuple[str, tuple[Any, ...]]]:  # fmt: skip
    """The CQL (with %s markers) and values that read `span` of the table (`key`: its
    partition key), applying the tenant filter where CQL allows it on a range; see the
    module docstring. A composite key holding `tenant` gives the DISTINCT key scan."""
    cols = ",".join(quote(n) for n in names)
    src = f"{quote(keyspace)}.{quote(table)}"
    tok = f"token({','.join(quote(k) for k in key)})"
    where = f"{tok} {'>=' if span.first else '>'} %s AND {tok} <= %s"
    if tenants is not None and TENANT_COLUMN in key:
        keys = ",".join(quote(k) for k in key)
        return [(f"SELECT DISTINCT {keys} FROM {src} WHERE {where}", (span.lo, span.hi))]
    if tenants is None:
        return [(f"SELECT {cols} FROM {src} WHERE {where}", (span.lo, span.hi))]
    return [
        (f"SELECT {cols} FROM {src} WHERE {where} AND tenant = %s ALLOW FILTERING",
         (span.lo, span.hi, t))
        for t in tenants
    ]  # fmt: skip


def partition_query(keyspace: str, table: str, names: Sequence[str], key: Sequence[str]) -> str:
    """One whole partition by its full key."""
    cols = ",".join(quote(n) for n in names)
    cond = " AND ".join(f"{quote(k)} = %s" for k in key)
    return f"SELECT {cols} FROM {quote(keyspace)}.{quote(table)} WHERE {cond}"


class CassandraReader(BaseReader):
    def __init__(self, target: CassandraTarget, schema: StructType, partitions: int) -> None:
        super().__init__(schema)
        self.target, self.n = target, partitions

    def partitions(self) -> Sequence[InputPartition]:
        cluster, _ = self.target.session()
        try:
            meta = cluster.metadata
            table = meta.keyspaces[self.target.keyspace].tables[self.target.table]
            key = tuple(c.name for c in table.partition_key)
            tenants = tenant_filter(self.pushed)
            if tenants == ():
                return [TenantKeys(())]  # filters no tenant can pass: nothing to read
            if tenants is not None and key == (TENANT_COLUMN,):
                n = max(1, min(self.n, len(tenants)))
                return [TenantKeys(tenants[i::n]) for i in range(n)]
            token_map = meta.token_map
            ring = [t.value for t in token_map.ring] if token_map is not None else []
            spans = [self._owned(meta, s) for s in ring_spans(ring)] if ring else ring_spans([])
            return [TokenSlice(run, key) for run in slices(spans, self.n)]
        finally:
            cluster.shutdown()

    def _owned(self, meta: Any, span: Span) -> Span:
        from cassandra.metadata import Murmur3Token

        hosts = meta.token_map.get_replicas(self.target.keyspace, Murmur3Token(span.hi))
        return Span(span.lo, span.hi, span.first, tuple(str(h.address) for h in hosts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        cluster, session = self.target.session()
        try:
            yield from self._read(cluster, session, partition)
        finally:
            cluster.shutdown()

    def _read(self, cluster: Any, session: Any, part: InputPartition) -> Iterator[pa.RecordBatch]:
        ks, table, names = self.target.keyspace, self.target.table, self.schema.names
        schema = self.arrow_schema()
        if isinstance(part, TenantKeys):
            query = partition_query(ks, table, names, (TENANT_COLUMN,))
            for t in part.tenants:
                yield from self._pages(session, query, (t,), None, schema)
            return
        assert isinstance(part, TokenSlice)
        tenants = tenant_filter(self.pushed)
        for span in part.spans:
            host = _local_replica(cluster, span.replicas)
            for query, values in scan_queries(ks, table, names, part.key, span, tenants):
                if tenants is not None and TENANT_COLUMN in part.key:
                    yield from self._matching(session, query, values, host, part.key, schema)
                else:
                    yield from self._pages(session, query, values, host, schema)

    def _matching(
        self, session: Any, query: str, values: tuple[Any, ...], host: Any,
        key: tuple[str, ...], schema: pa.Schema,
    ) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """The partitions of a DISTINCT key scan whose tenant passes the filter, read whole."""
        tenants = set(tenant_filter(self.pushed) or ())
        at = key.index(TENANT_COLUMN)
        one = partition_query(self.target.keyspace, self.target.table, self.schema.names, key)
        for batch in self._row_pages(session, query, values, host):
            for k in batch:
                if k[at] in tenants:
                    yield from self._pages(session, one, tuple(k), host, schema)

    def _row_pages(
        self, session: Any, query: str, values: tuple[Any, ...], host: Any
    ) -> Iterator[list[Any]]:
        from cassandra.query import SimpleStatement

        stmt = SimpleStatement(query, fetch_size=FETCH_SIZE)
        result = session.execute(stmt, values, host=host)
        while True:  # page by page: one page in memory at a time
            yield list(result.current_rows)
            if not result.has_more_pages:
                return
            result.fetch_next_page()

    def _pages(
        self, session: Any, query: str, values: tuple[Any, ...], host: Any, schema: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        for rows in self._row_pages(session, query, values, host):
            if rows:
                yield apply(to_batch(rows, schema), self.pushed)


def _local_replica(cluster: Any, replicas: tuple[str, ...]) -> Any:
    """The first live replica in the local data centre (None: the driver chooses)."""
    if not replicas:
        return None
    from cassandra.policies import HostDistance

    policy = cluster.profile_manager.default.load_balancing_policy
    by_address = {str(h.address): h for h in cluster.metadata.all_hosts()}
    for address in replicas:
        host = by_address.get(address)
        if host is not None and host.is_up and policy.distance(host) == HostDistance.LOCAL:
            return host
    return None
