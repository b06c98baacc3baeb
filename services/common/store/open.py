"""Open the configured backend of each store: Cassandra when contact points are set,
otherwise the embedded SQLite files under `data_dir`; the queue store also per tenant, on
Redis Streams (`queue_store_by_tenant`, tenant_queues.py)."""

from __future__ import annotations

from pydantic import SecretStr
from redis.asyncio import Redis

from services.common.config import ServiceSettings
from services.common.redis_client import PoolLimits, redis_client
from services.common.store.audit_log import AuditStore
from services.common.store.eventlog import LoggedSessionStore
from services.common.store.ports_auth import AdminTokenStore, AuthStore
from services.common.store.ports_bans import BanStore
from services.common.store.ports_queue import QueueStore
from services.common.store.ports_router import RouterStore
from services.common.store.ports_rules import RuleStore
from services.common.store.ports_usage import UsageStore


def _cassandra_args(s: ServiceSettings) -> dict[str, object]:
    return {
        "contact_points": s.cassandra_contact_points,
        "port": s.cassandra_port,
        "keyspace": s.cassandra_keyspace,
        "consistency": s.cassandra_consistency,
        "serial_consistency": s.cassandra_serial_consistency,
        "replication": s.cassandra_replication,
    }


def open_auth_store(s: ServiceSettings) -> AuthStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra import CassandraStore

        return CassandraStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite import SqliteStore

    return SqliteStore(s.data_dir / "auth.db")


def open_session_store(s: ServiceSettings) -> LoggedSessionStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_session import CassandraSessionStore

        return CassandraSessionStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_session import SqliteSessionStore

    return SqliteSessionStore(s.data_dir / "sessions.db", s.store_sync)


def open_queue_store(s: ServiceSettings) -> QueueStore:
    """The store's queues alone, or, when a tenant is on Redis Streams (or `queue_redis_url`
    is set), the per-tenant dispatcher over the store and Redis (tenant_queues.py)."""
    kinds = {s.queue_store_default, *s.queue_store_by_tenant.values()}
    if kinds == {"store"} and not s.queue_redis_url:
        return _open_stored_queues(s)
    from services.common.store.redis_queue import RedisQueueStore
    from services.common.store.tenant_queues import TenantQueueStores

    stores = {
        "store": _open_stored_queues(s),
        "redis": RedisQueueStore(redis=_queue_redis(s), key_prefix=s.queue_redis_key_prefix),
    }
    return TenantQueueStores(
        stores=stores, by_tenant=s.queue_store_by_tenant, default_kind=s.queue_store_default
    )


def _queue_redis(s: ServiceSettings) -> Redis:
    """The Redis client of the Redis Streams queues: `queue_redis_url` (one server), else
    the service's own Redis settings; a pool of `queue_redis_max_connections`."""
    limits = PoolLimits(max_connections=s.queue_redis_max_connections, pool_timeout_s=10.0)
    if not s.queue_redis_url:
        return redis_client(s, limits)
    # Only the URL's credentials: the service's redis_password is for its own Redis.
    url, no_password = s.queue_redis_url, SecretStr("")
    own = s.model_copy(
        update={"redis_mode": "standalone", "redis_url": url, "redis_password": no_password}
    )
    return redis_client(own, limits)


def _open_stored_queues(s: ServiceSettings) -> QueueStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_queue import CassandraQueueStore

        return CassandraQueueStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_queue import SqliteQueueStore

    return SqliteQueueStore(s.data_dir / "queues.db", s.store_sync)


def open_router_store(s: ServiceSettings) -> RouterStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_router import CassandraRouterStore

        return CassandraRouterStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_router import SqliteRouterStore

    return SqliteRouterStore(s.data_dir / "router.db", s.store_sync)


def open_token_store(s: ServiceSettings) -> AdminTokenStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_tokens import CassandraTokenStore

        return CassandraTokenStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_tokens import SqliteTokenStore

    return SqliteTokenStore(s.data_dir / "admin_tokens.db")


def open_rule_store(s: ServiceSettings) -> RuleStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_rules import CassandraRuleStore

        return CassandraRuleStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_rules import SqliteRuleStore

    return SqliteRuleStore(s.data_dir / "rules.db")


def open_usage_store(s: ServiceSettings) -> UsageStore:
    if s.cassandra_contact_points:
        from services.common.store.cassandra_usage import CassandraUsageStore

        return CassandraUsageStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_usage import SqliteUsageStore

    return SqliteUsageStore(s.data_dir / "usage.db")


def open_ban_store(s: ServiceSettings) -> BanStore:
    """Cassandra (every quota instance of the cluster sees one list), else the SQLite file of
    the data dir (shared by the instances of one machine)."""
    if s.cassandra_contact_points:
        from services.common.store.cassandra_bans import CassandraBanStore

        return CassandraBanStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_bans import SqliteBanStore

    return SqliteBanStore(s.data_dir / "quota" / "bans.sqlite3")


def open_audit_store(s: ServiceSettings) -> AuditStore:
    """The console's audit log: Cassandra (every console instance writes one log), else the
    SQLite file of the data dir."""
    if s.cassandra_contact_points:
        from services.common.store.cassandra_audit import CassandraAuditStore

        return CassandraAuditStore(**_cassandra_args(s))  # type: ignore[arg-type]
    from services.common.store.sqlite_audit import SqliteAuditStore

    return SqliteAuditStore(s.data_dir / "audit.db")
