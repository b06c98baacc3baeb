"""Open the configured backend of each store: Cassandra when contact points are set,
otherwise the embedded SQLite files under `data_dir`."""

from __future__ import annotations

from services.common.config import ServiceSettings
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
