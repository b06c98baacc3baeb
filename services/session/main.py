"""Composition root of the session service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc
from nats.aio.client import Client
from nats.aio.msg import Msg
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.bus import subjects
from services.common.bus.client import LateClient, connect, drain
from services.common.bus.publisher import ServicePublisher
from services.common.bus.unary import (
    CONNECT_MANY_SUFFIX,
    CONNECT_SUFFIX,
    DISCONNECT_SUFFIX,
    UnaryServer,
    servicer_handler,
)
from services.common.dependencies import JETSTREAM_UNREACHABLE, redis_ready, wait_for
from services.common.refusals import Refusals, register_refusal_metrics
from services.common.runtime import run_service
from services.common.store.open import open_auth_store, open_session_store, open_token_store
from services.metrics.client import MetricsClient, TenantCounters, report_every
from services.queue.client import QueueClient
from services.quota.client import QuotaClient
from services.quota.subscriptions import SubscriptionCounts
from services.quota.watch import BanWatch
from services.router.client import RouterClient
from services.rules.client import RuleFeed
from services.session.api import SessionAdminApi, SessionApi
from services.session.auth import Authenticator
from services.session.authenticators.cert import CertAuthenticator
from services.session.authenticators.chain import Chains
from services.session.authenticators.http_auth import HttpAuthConfig, HttpAuthenticator
from services.session.authenticators.jwt_auth import JwtAuthenticator, JwtConfig
from services.session.authenticators.password import PasswordAuthenticator
from services.session.config import SessionSettings
from services.session.enhanced import EnhancedAuth
from services.session.event_recorder import EventRecorder
from services.session.events import Events, ensure_stream
from services.session.fence import watch_generation
from services.session.flapping import FlapDetector
from services.session.gatekeeper import Gatekeeper
from services.session.liveness import NodeLiveness, SeenRecords
from services.session.login import Login
from services.session.registry import Registry
from services.session.sessions import Sessions
from services.session.throttle import AuthThrottle, Backoff, HashGate
from services.session.token_api import TokenAdminApi, TokenApi
from services.session.tokens import AdminTokens
from services.session.verdict import Authenticator as Authenticator_
from services.session.wills import StoredWills
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import admin_tokens_pb2_grpc as tokens_grpc
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc


class SessionService:
    def __init__(self, settings: SessionSettings) -> None:
        self._settings = settings
        # A restarted Redis (or a failover) breaks every pooled connection at once: a command
        # is retried on a fresh one rather than failing the CONNECT that happened to use it.
        # A bounded pool that makes a command wait for a connection (redis-py's default pool
        # raises MaxConnectionsError past 100 connections in use: a CONNECT storm would fail).
        pool = BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            timeout=settings.redis_pool_timeout_s,
            password=settings.redis_password.get_secret_value() or None,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        self._redis = Redis(connection_pool=pool)
        self._redis.auto_close_connection_pool = True  # aclose() closes the pool too
        self._store = open_auth_store(settings)
        self._session_store = open_session_store(settings)
        self._token_store = open_token_store(settings)
        # The runtime resolves tenant admin tokens through this (no remote call, no cache).
        self.admin_tokens = AdminTokens(
            self._token_store, settings.admin_token_max_ttl_s, settings.admin_tokens_per_tenant_max
        )
        self._nats = LateClient()
        nc: Client = self._nats  # type: ignore[assignment]
        self._gate = HashGate(settings.auth_max_concurrent_hashes, settings.auth_max_queued_hashes)
        self._auth = Authenticator(
            self._store,
            self._redis,
            settings.auth_cache_ttl_s,
            settings.anonymous_tenants,
            self._gate,
            settings.auth_local_cache_ttl_s,
            settings.auth_local_cache_entries,
        )
        self._http_auth: HttpAuthenticator | None = None
        self._login = self._build_login(settings)
        self._registry = Registry(self._redis)
        self._router = RouterClient(settings.router_addr)
        self._queues = QueueClient(settings.queue_addr)
        self._events = Events(nc, settings.node_id)
        self._sessions = Sessions(
            self._session_store,
            self._router,
            self._queues,
            settings.max_session_expiry_s,
            self._events,
            self._registry.session_ended,
        )
        self._sweeper: asyncio.Task[None] | None = None
        # Wills of connections whose node died (ids of this instance's own); the rules read
        # them as they read a node's publishes once the feed is up (`start`).
        self._will_publisher = ServicePublisher(nc, self._router, settings.node_id)
        self._wills = StoredWills(self._will_publisher)
        self._rule_feed: RuleFeed | None = None
        self._feeding: asyncio.Task[None] | None = None
        self._liveness = NodeLiveness(
            self._registry,
            self._sessions,
            settings.node_timeout_s,
            SubscriptionCounts(self._redis).drop_node,
            self._wills,
            seen=SeenRecords(self._redis),  # shared, by Redis's clock (liveness.py)
        )
        self._watcher: asyncio.Task[None] | None = None
        self._fence: asyncio.Task[None] | None = None
        self._recording: asyncio.Task[None] | None = None
        self._refusals = Refusals()
        register_refusal_metrics(self._refusals, "starling.session")
        self._api: SessionApi | None = None
        self._servers: list[UnaryServer] = []
        self._reporter: asyncio.Task[None] | None = None
        # The ban list (a copy, kept current) and flapping detection, checked at CONNECT.
        self._quota = QuotaClient(settings.quota_addr, timeout_s=2.0)
        self._ban_watch = BanWatch(
            QuotaClient(settings.quota_addr, timeout_s=2.0), settings.ban_sync_s
        )
        flapping = None
        if settings.flapping_enabled:
            flapping = FlapDetector(
                self._redis,
                settings.flapping_max_connects,
                settings.flapping_window_s,
                settings.flapping_max_connects_per_address,
                settings.node_id,
            )
        self._gatekeeper = Gatekeeper(
            self._ban_watch.bans, self._quota, flapping, settings.flapping_ban_s
        )

    def _build_login(self, s: SessionSettings) -> Login:
        """The authenticators the tenants' chains name, and the back-off in front of them."""
        used = {name for chain in s.auth_chain.values() for name in chain}
        authenticators: dict[str, Authenticator_] = {
            "password": PasswordAuthenticator(self._auth),
            "cert": CertAuthenticator(s.cert_identity),
        }
        if "jwt" in used:
            authenticators["jwt"] = JwtAuthenticator(
                JwtConfig(
                    algorithms=tuple(s.jwt_algorithms),
                    secret=s.jwt_secret.get_secret_value(),
                    public_key_file=s.jwt_public_key_file,
                    jwks_url=s.jwt_jwks_url,
                    jwks_cache_s=s.jwt_jwks_cache_s,
                    audience=s.jwt_audience,
                    issuer=s.jwt_issuer,
                    tenant_claim=s.jwt_tenant_claim,
                    username_claim=s.jwt_username_claim,
                    acl_claim=s.jwt_acl_claim,
                )
            )
        if "http" in used:
            self._http_auth = HttpAuthenticator(
                HttpAuthConfig(
                    url=s.http_auth_url,
                    timeout_s=s.http_auth_timeout_s,
                    on_timeout=s.http_auth_on_timeout,
                    cache_ttl_s=s.http_auth_cache_ttl_s,
                    cache_size=s.http_auth_cache_size,
                    max_concurrent=s.http_auth_max_concurrent,
                )
            )
            authenticators["http"] = self._http_auth

        def backoff(threshold: int) -> Backoff:
            return Backoff(
                threshold,
                s.auth_backoff_base_s,
                s.auth_backoff_max_s,
                s.auth_failure_window_s,
                s.auth_backoff_max_tracked,
            )

        throttle = AuthThrottle(
            backoff(s.auth_failures_before_backoff_user), backoff(s.auth_failures_before_backoff_ip)
        )
        return Login(
            self._auth,
            Chains(s.auth_chain, authenticators),
            EnhancedAuth(self._auth),
            throttle,
            s.cert_identity,
        )

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        nc: Client = self._nats  # type: ignore[assignment]
        self._api = SessionApi(
            self._auth,
            self._registry,
            nc,
            self._events,
            self._settings.acl_default == "allow",
            self._sessions,
            self._login,
            self._settings.max_connections_per_tenant,
            self._settings.shared_client_id_tenants,
            self._refusals,
            self._gatekeeper,
            self._wills,
            self._settings.will_store_max_bytes,
            self._liveness.silent_for,
        )
        pb_grpc.add_SessionServiceServicer_to_server(self._api, server)
        pb_grpc.add_SessionAdminServiceServicer_to_server(
            SessionAdminApi(self._auth, self._registry, nc), server
        )
        tokens_grpc.add_TokenAdminServiceServicer_to_server(
            TokenAdminApi(self.admin_tokens), server
        )
        tokens_grpc.add_TokenServiceServicer_to_server(TokenApi(self.admin_tokens), server)
        return [
            s.full_name
            for d in (pb.DESCRIPTOR, tokens_pb.DESCRIPTOR)
            for s in d.services_by_name.values()
        ]

    async def start(self) -> None:
        await redis_ready(self._redis, self._settings.dependency_wait_s)
        self._nats.nc = await connect(
            self._settings.nats_url, self._settings.node_id, **self._settings.nats_options()
        )
        # 3 on a NATS cluster: one server may die without the stream stopping.
        js = self._nats.nc.jetstream()
        await wait_for(
            "jetstream",
            lambda: ensure_stream(js, self._settings.nats_stream_replicas),
            self._settings.dependency_wait_s,
            JETSTREAM_UNREACHABLE,
        )
        self._sweeper = asyncio.create_task(
            self._sessions.run_sweeper(self._settings.session_expiry_sweep_s)
        )
        # In the background: without a rules instance the first snapshot waits for the
        # feed's resync, not this start (a will is due no sooner than node_timeout_s).
        self._rule_feed = RuleFeed(self._nats.nc)
        self._will_publisher.rules = self._rule_feed
        self._feeding = asyncio.create_task(self._rule_feed.start())
        await self._liveness.start(self._nats.nc)
        self._watcher = asyncio.create_task(self._liveness.run())
        self._recorder = EventRecorder(
            self._nats.nc, self._session_store, self._settings.event_log_batch_max
        )
        self._recording = asyncio.create_task(self._recorder.run())
        self._fence = asyncio.create_task(watch_generation(self._registry, self._nats.nc))
        await self._watch_auth_changes(self._nats.nc)
        await self._ban_watch.start(self._nats.nc)
        # The nodes' CONNECTs and ends of connections come over NATS request/reply
        # (services/common/bus/unary.py); the same servicer answers gRPC callers.
        if self._api is not None:
            for suffix, method, request in (
                (CONNECT_SUFFIX, self._api.Connect, pb.ConnectRequest),
                (CONNECT_MANY_SUFFIX, self._api.ConnectMany, pb.ConnectManyRequest),
                (DISCONNECT_SUFFIX, self._api.Disconnect, pb.DisconnectRequest),
            ):
                server = UnaryServer(
                    self._nats.nc,
                    self._settings.session_subject + suffix,
                    "session",
                    servicer_handler(method, request),
                )
                await server.start()
                self._servers.append(server)
        # Refusals by the tenants' connection quota, decided here, and the sessions this
        # instance expired go to the cluster view.
        self._reporter = asyncio.create_task(
            report_every(
                MetricsClient(self._settings.metrics_addr),
                f"session:{self._settings.node_id}",
                self._report,
                self._settings.stats_interval_s,
                kind="session",
            )
        )

    def _report(self) -> list[TenantCounters]:
        refused = self._refusals.quota_by_tenant()
        expired = self._sessions.expired_by_tenant
        return [
            TenantCounters(
                tenant=t, quota_refusals=refused.get(t, 0), sessions_expired=expired.get(t, 0)
            )
            for t in sorted({*refused, *expired} - {"-"})
        ]

    async def _watch_auth_changes(self, nc: Client) -> None:
        """Every instance drops its copies of a changed user or ACL (services/session/cache.py);
        this one announces its own changes."""

        async def on_change(msg: Msg) -> None:
            self._auth.changed(msg.data)

        async def announce(change: bytes) -> None:
            await nc.publish(subjects.AUTH_CHANGED, change)

        await nc.subscribe(subjects.AUTH_CHANGED, cb=on_change)
        self._auth.announce = announce

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop()
        for task in (self._sweeper, self._watcher, self._fence, self._recording, self._reporter):
            if task is not None:
                task.cancel()
        await self._sessions.stop(min(2.0, self._settings.shutdown_grace_s / 2))
        await self._wills.settle(min(2.0, self._settings.shutdown_grace_s / 2))
        if self._feeding is not None:
            self._feeding.cancel()
        if self._rule_feed is not None:
            await self._rule_feed.stop()
        await self._router.close()
        await self._queues.close()
        await self._ban_watch.stop()
        await self._quota.close()
        if self._nats.nc is not None:
            await drain(self._nats.nc)
        if self._http_auth is not None:
            await self._http_auth.close()
        self._gate.close()
        await self._redis.aclose()
        await self._store.close()
        await self._session_store.close()
        await self._token_store.close()


def main() -> int:
    return run_service("session", SessionSettings, SessionService)
