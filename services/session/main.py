"""Composition root of the session service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import cast

import grpc
from nats.aio.client import Client
from nats.aio.msg import Msg

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
from services.common.store.session_listing import SessionListing
from services.common.subscription_counts import SubscriptionCounts
from services.metrics.client import MetricsClient, TenantCounters, report_every
from services.rules.client import RuleFeed
from services.session.admin_api import SessionAdminApi
from services.session.api import SessionApi
from services.session.assembly import (
    Remotes,
    Stores,
    build_auth,
    build_gatekeeper,
    build_login,
    http_authenticator,
    session_redis,
)
from services.session.config import SessionSettings
from services.session.connecting import ConnectDeps, Connecting, ConnectRules
from services.session.event_recorder import EventRecorder
from services.session.events import Events, ensure_stream
from services.session.failover import PrimaryWatch
from services.session.fence import watch_generation
from services.session.listing import ClientListing
from services.session.liveness import NodeLiveness, SeenRecords
from services.session.offline import OfflineSessions
from services.session.registry import Registry, decode_holder
from services.session.sessions import Sessions
from services.session.throttle import HashGate
from services.session.token_api import TokenAdminApi, TokenApi
from services.session.tokens import AdminTokens
from services.session.wills import StoredWills
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import admin_tokens_pb2_grpc as tokens_grpc
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc


class SessionService:
    def __init__(self, settings: SessionSettings) -> None:
        s = self._settings = settings
        self._redis = session_redis(settings)
        self._stores = Stores.open(settings)
        self.admin_tokens = AdminTokens(  # the runtime resolves tenant admin tokens here
            self._stores.tokens, s.admin_token_max_ttl_s, s.admin_tokens_per_tenant_max
        )
        self._nats = LateClient()
        nc: Client = self._nats  # type: ignore[assignment]
        self._gate = HashGate(s.auth_max_concurrent_hashes, s.auth_max_queued_hashes)
        self._auth = build_auth(
            s, self._stores.auth, self._redis, self._gate, announce=self._announce_auth_change
        )
        self._http_auth = http_authenticator(settings)
        self._remotes = Remotes.of(settings)
        self._registry = Registry(self._redis)
        self._events = Events(nc, s.node_id)
        self._sessions = Sessions(
            store=self._stores.session,
            router=self._remotes.router,
            queues=self._remotes.queues,
            max_expiry_s=s.max_session_expiry_s,
            events=self._events,
            session_ended=self._registry.session_ended,
        )
        # The feed is started by `start` (in the background: without a rules instance the
        # first snapshot waits for the feed's resync; a will is due no sooner than
        # node_timeout_s); until its filters come it wants nothing.
        self._rule_feed = RuleFeed(nc)
        self._wills = self._stored_wills(nc)
        self._liveness = NodeLiveness(
            registry=self._registry,
            sessions=self._sessions,
            timeout_s=s.node_timeout_s,
            drop_subscriptions=SubscriptionCounts(self._redis).drop_node,
            wills=self._wills,
            seen=SeenRecords(self._redis),  # shared, by Redis's clock (liveness.py)
        )
        self._refusals = Refusals()
        register_refusal_metrics(self._refusals, "starling.session")
        self._api = SessionApi(
            login=build_login(settings, self._auth, self._http_auth),
            connecting=self._connecting(nc),
            sessions=self._sessions,
            acl_default_allow=s.acl_default == "allow",
        )
        self._admin_api = self._build_admin_api(nc)
        self._servers: list[UnaryServer] = []
        self._loops: list[asyncio.Task[None]] = []  # background loops, cancelled first at stop
        self._feeding: list[asyncio.Task[None]] = []  # the rule feed's start, cancelled later

    def _stored_wills(self, nc: Client) -> StoredWills:
        """Wills of connections whose node died, published with ids of this instance's own;
        the rules read them as they read a node's publishes once the feed is up."""
        publisher = ServicePublisher(
            nc, self._remotes.router, self._settings.node_id, rules=self._rule_feed
        )
        return StoredWills(publisher)

    def _connecting(self, nc: Client) -> Connecting:
        s = self._settings
        deps = ConnectDeps(
            auth=self._auth,
            registry=self._registry,
            nc=nc,
            events=self._events,
            sessions=self._sessions,
            refusals=self._refusals,
            gatekeeper=build_gatekeeper(s, self._redis, self._remotes),
            wills=self._wills,
            silent_for=self._liveness.silent_for,
        )
        rules = ConnectRules(
            acl_default_allow=s.acl_default == "allow",
            max_connections_per_tenant=s.max_connections_per_tenant,
            shared_client_id_tenants=frozenset(s.shared_client_id_tenants),
            will_store_max_bytes=s.will_store_max_bytes,
        )
        return Connecting(deps=deps, rules=rules)

    def _build_admin_api(self, nc: Client) -> SessionAdminApi:
        offline = OfflineSessions(
            listing=cast(SessionListing, self._stores.session),
            queue_stats=self._remotes.queue_admin.queue_stats,
            discard=self._sessions.discard_offline,
        )
        return SessionAdminApi(
            auth=self._auth,
            registry=self._registry,
            nc=nc,
            offline=offline,
            listing=ClientListing(redis=self._redis, decode=decode_holder),
        )

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_SessionServiceServicer_to_server(self._api, server)
        pb_grpc.add_SessionAdminServiceServicer_to_server(self._admin_api, server)
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
        s = self._settings
        await redis_ready(self._redis, s.dependency_wait_s)
        self._nats.nc = nc = await connect(s.nats_url, s.node_id, **s.nats_options())
        # 3 on a NATS cluster: one server may die without the stream stopping.
        js = nc.jetstream()
        await wait_for(
            "jetstream",
            lambda: ensure_stream(js, s.nats_stream_replicas),
            s.dependency_wait_s,
            JETSTREAM_UNREACHABLE,
        )
        self._loops.append(
            asyncio.create_task(self._sessions.run_sweeper(s.session_expiry_sweep_s))
        )
        self._feeding.append(asyncio.create_task(self._rule_feed.start()))
        await self._liveness.start(nc)
        self._loops.append(asyncio.create_task(self._liveness.run()))
        recorder = EventRecorder(nc, self._stores.session, s.event_log_batch_max)
        self._loops.append(asyncio.create_task(recorder.run()))
        fence = watch_generation(self._registry, nc, primary=PrimaryWatch(self._redis))
        self._loops.append(asyncio.create_task(fence))
        await nc.subscribe(subjects.AUTH_CHANGED, cb=self._on_auth_change)
        await self._remotes.ban_watch.start(nc)
        await self._serve_over_nats(nc)
        # Refusals by the tenants' connection quota, decided here, and the sessions this
        # instance expired go to the cluster view.
        reporting = report_every(
            MetricsClient(s.metrics_addr),
            f"session:{s.node_id}",
            self._report,
            s.stats_interval_s,
            kind="session",
        )
        self._loops.append(asyncio.create_task(reporting))

    async def _serve_over_nats(self, nc: Client) -> None:
        """The nodes' CONNECTs and ends of connections come over NATS request/reply
        (services/common/bus/unary.py); the same servicer answers gRPC callers."""
        for suffix, method, request in (
            (CONNECT_SUFFIX, self._api.Connect, pb.ConnectRequest),
            (CONNECT_MANY_SUFFIX, self._api.ConnectMany, pb.ConnectManyRequest),
            (DISCONNECT_SUFFIX, self._api.Disconnect, pb.DisconnectRequest),
        ):
            server = UnaryServer(
                nc,
                self._settings.session_subject + suffix,
                "session",
                servicer_handler(method, request),
            )
            await server.start()
            self._servers.append(server)

    def _report(self) -> list[TenantCounters]:
        refused = self._refusals.quota_by_tenant()
        expired = self._sessions.expired_by_tenant
        return [
            TenantCounters(
                tenant=t, quota_refusals=refused.get(t, 0), sessions_expired=expired.get(t, 0)
            )
            for t in sorted({*refused, *expired} - {"-"})
        ]

    async def _on_auth_change(self, msg: Msg) -> None:
        """Every instance drops its copies of a changed user or ACL (services/session/cache.py)."""
        self._auth.changed(msg.data)

    async def _announce_auth_change(self, change: bytes) -> None:
        """This instance's own changes, announced once NATS is up."""
        if self._nats.nc is not None:
            await self._nats.nc.publish(subjects.AUTH_CHANGED, change)

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop()
        for task in self._loops:
            task.cancel()
        grace_s = min(2.0, self._settings.shutdown_grace_s / 2)
        await self._sessions.stop(grace_s)
        await self._wills.settle(grace_s)
        for task in self._feeding:
            task.cancel()
        await self._rule_feed.stop()
        await self._remotes.close()
        if self._nats.nc is not None:
            await drain(self._nats.nc)
        if self._http_auth is not None:
            await self._http_auth.close()
        self._gate.close()
        await self._redis.aclose()
        await self._stores.close()


def main() -> int:
    return run_service("session", SessionSettings, SessionService)
