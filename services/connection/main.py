"""Composition root of the connection service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

import grpc
from aiohttp import web
from nats.aio.client import Client

from services.common.ban_watch import BanWatch
from services.common.bus.client import connect
from services.common.forwarded import TrustedProxies
from services.common.limits_copies import LimitsCopies
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals, register_refusal_metrics
from services.common.runtime import DRAINING, run_service
from services.common.topics import TopicLimits
from services.connection.api import ConnectionAdminApi
from services.connection.channel import ChannelConfig
from services.connection.config import ConnectionSettings
from services.connection.drain import Drain
from services.connection.drop_log import DropLog
from services.connection.lease import register_lease_metrics
from services.connection.listener import TcpKeepalive, server_ssl_context, start_tcp, start_ws
from services.connection.node import Node
from services.connection.node_parts import NodeLinks, NodeSettings
from services.connection.proxied import ProxyHeaderPolicy, ProxyListener
from services.connection.quota import NodeQuota
from services.connection.replica import CopyRouter, RouteCopies
from services.connection.rules_tap import RulesRouter
from services.connection.stats import register_metrics
from services.connection.subscription_slots import SubscriptionSlots
from services.metrics.client import MetricsClient, report_every
from services.queue.client import QueueClient
from services.quota.client import QuotaClient, bans_from_announcement
from services.router.client import RouterClient
from services.rules.client import RuleFeed
from services.session.client import SessionClient
from starling.connection.v1 import connection_pb2 as pb
from starling.connection.v1 import connection_pb2_grpc as pb_grpc

log = logging.getLogger("starling.connection")


def channel_config(s: ConnectionSettings) -> ChannelConfig:
    return ChannelConfig(
        node_id=s.node_id,
        max_packet_size_bytes=s.max_packet_size_bytes,
        max_connect_packet_size_bytes=s.max_connect_packet_size_bytes,
        max_user_properties=s.max_user_properties,
        max_filters_per_subscribe=s.max_filters_per_subscribe,
        max_subscriptions_per_client=s.max_subscriptions_per_client,
        receive_maximum=s.receive_maximum,
        topic_alias_maximum=s.topic_alias_maximum,
        outbound_topic_alias_maximum=s.outbound_topic_alias_maximum,
        max_keepalive_s=s.max_keepalive_s,
        server_keepalive_s=s.server_keepalive_s,
        connect_timeout_s=s.connect_timeout_s,
        auto_subscribe_timeout_s=s.auto_subscribe_timeout_s,
        v3_inflight=s.v3_inflight,
        max_queued_messages=s.max_queued_messages,
        max_queued_bytes=s.max_queued_bytes,
        slow_consumer_timeout_s=s.slow_consumer_timeout_s,
        control_packets_per_s=s.control_packets_per_s,
        control_packets_burst=s.control_packets_burst,
        topic_limits=TopicLimits(s.max_topic_length_bytes, s.max_topic_levels),
        defer_publish_acks=True,
        reason_strings=s.reason_strings,
        response_information=s.response_information,
        redirects={t: (r.server_reference, r.moved) for t, r in s.redirects.items()},
    )


def node_settings(s: ConnectionSettings) -> NodeSettings:
    return NodeSettings(
        config=channel_config(s),
        tracing=s.tracing,
        max_connections_per_ip=s.max_connections_per_ip,
        mesh_interest_window_s=s.mesh_interest_window_s,
        will_store_max_bytes=s.will_store_max_bytes,
        self_fence_s=s.self_fence_s,
        linger_s=s.close_linger_s,
        linger_max_sockets=s.close_linger_max_sockets,
        ack_wait_s=s.close_ack_wait_s,
    )


class ConnectionService:
    def __init__(self, settings: ConnectionSettings) -> None:
        self._s = settings
        self.node: Node | None = None
        self._servers: list[asyncio.Server | ProxyListener] = []
        self._runners: list[web.AppRunner] = []
        self._reporter: asyncio.Task[None] | None = None
        self._copies: RouteCopies | None = None
        self._bans: BanWatch | None = None
        self._rule_feed: RuleFeed | None = None
        self.ports: dict[str, int] = {}
        self._stopping = False
        # Set when the node can no longer carry traffic (health turns NOT_SERVING); made in
        # `start`, on the loop that runs the service.
        self.unhealthy: asyncio.Future[str] | None = None
        # Resolved when a drain is done: the runtime then stops the process as on SIGTERM.
        self.finished: asyncio.Future[None] | None = None
        self.drain: Drain | None = None
        # Sets gRPC health (readiness) SERVING/NOT_SERVING; given by the runtime once serving.
        self._readiness: Callable[[bool], Awaitable[None]] | None = None
        self._health_tasks: set[asyncio.Task[None]] = set()

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_ConnectionAdminServiceServicer_to_server(ConnectionAdminApi(self), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        s = self._s
        loop = asyncio.get_running_loop()
        self.unhealthy = loop.create_future()
        self.finished = loop.create_future()
        queue = QueueClient(s.queue_addr)
        nc, nc_shared = await self._connect_bus(queue)
        router = RouterClient(s.router_addr)
        router.use_bus(nc)  # the persistent publish path over NATS request/reply
        queue.use_bus(nc)
        # QoS>=1 publishes straight to the queues where this node holds the route table.
        self._copies = RouteCopies(router, nc, s.route_copy_max_subscriptions)
        await self._copies.start()
        # CONNECT and end of connection over NATS request/reply too.
        session = SessionClient(s.session_addr)
        session.use_bus(nc, s.session_subject)
        # Which messages the rules read, known before the first client connects.
        self._rule_feed = feed = RuleFeed(nc, s.rule_filters_resync_s)
        await feed.start()
        refusals = Refusals()
        quota, slots = self._quota(refusals)
        links = NodeLinks(
            nc=nc,
            nc_shared=nc_shared,
            session=session,
            router=router,
            queue=queue,
            publish_router=RulesRouter(CopyRouter(router, queue, self._copies), feed),
            quota=quota,
            rule_feed=feed,
            slots=slots,
            refusals=refusals,
            on_lease_change=self._lease_changed,
        )
        self.node = node = Node(settings=node_settings(s), links=links)
        await node.start()
        if node.slots is not None:
            node.slots.start()
        await self._watch(node)
        await self._listen(node)

    def _quota(
        self, refusals: Refusals
    ) -> tuple[NodeQuota | None, Callable[[dict[str, int]], SubscriptionSlots] | None]:
        """The tenants' rate budgets and their max_tenant_subscriptions counted cluster-wide,
        both through the quota service (None, None: quotas off)."""
        s = self._s
        if not s.quota_enabled:
            return None, None
        limits = LimitsCopies(QuotaClient(s.quota_addr, timeout_s=1.0))
        quota = NodeQuota(
            node_id=s.node_id,
            client=QuotaClient(s.quota_addr, timeout_s=1.0),
            on_refused=refusals.count,
            unavailable=s.quota_unavailable,
            slices=s.quota_lease_slices,
            limits=limits,
        )

        def slots(counts: dict[str, int]) -> SubscriptionSlots:
            return SubscriptionSlots(
                QuotaClient(s.quota_addr, timeout_s=1.0), s.node_id, limits, counts
            )

        return quota, slots

    async def _watch(self, node: Node) -> None:
        """What watches the running node: its drain, ban kicks, metrics and reports."""
        s = self._s
        assert self.finished is not None
        self.drain = Drain(
            node=node,
            rate_per_s=s.drain_rate_per_s,
            timeout_s=s.drain_timeout_s,
            default_reference=s.drain_server_reference,
            stop_accepting=self._stop_accepting,
            finished=self.finished,
        )
        # Bans: already connected clients named by a new ban are kicked (the session
        # service refuses their next CONNECT).
        watch_client = QuotaClient(s.quota_addr, timeout_s=2.0)
        self._bans = BanWatch(
            client=watch_client,
            decode=bans_from_announcement,
            sync_s=s.ban_sync_s,
            on_change=node.admission.kick_banned,
        )
        await self._bans.start(node.nc)
        register_metrics(node.stats)
        register_lease_metrics(node.lease)
        register_refusal_metrics(node.refusals, "starling.connection")
        self._reporter = asyncio.create_task(
            report_every(
                MetricsClient(s.metrics_addr),
                node.node_id,
                DropLog(node.registry.conns).before(node.stats.report),  # drops logged too
                s.stats_interval_s,
            )
        )

    async def _listen(self, node: Node) -> None:
        """Open the MQTT listeners (TCP, TLS, WS, WSS as configured)."""
        s = self._s
        keepalive = TcpKeepalive(
            s.tcp_keepalive_idle_s, s.tcp_keepalive_interval_s, s.tcp_keepalive_count
        )
        reuse = s.reuse_port
        proxy = ProxyHeaderPolicy(s.proxy_header_timeout_s) if s.proxy_protocol else None
        trusted = TrustedProxies.parse(s.trusted_proxies)
        tcp = await start_tcp(
            node, s.mqtt_host, s.mqtt_port, keepalive=keepalive, reuse_port=reuse, proxy=proxy
        )
        self._servers.append(tcp)
        self.ports["mqtt"] = tcp.sockets[0].getsockname()[1]
        ctx = None
        if s.tls_cert_file and s.tls_key_file:
            ctx = server_ssl_context(
                s.tls_cert_file, s.tls_key_file, s.tls_ca_file, s.tls_require_client_cert
            )
        if s.tls_port >= 0 and ctx is not None:
            tls = await start_tcp(node, s.mqtt_host, s.tls_port, ctx, keepalive, reuse, proxy)
            self._servers.append(tls)
            self.ports["mqtts"] = tls.sockets[0].getsockname()[1]
        if s.ws_port >= 0:
            self._runners.append(
                await start_ws(
                    node,
                    s.mqtt_host,
                    s.ws_port,
                    s.ws_path,
                    keepalive=keepalive,
                    reuse_port=reuse,
                    trusted=trusted,
                )
            )
            self.ports["ws"] = s.ws_port
        if s.wss_port >= 0 and ctx is not None:
            self._runners.append(
                await start_ws(
                    node, s.mqtt_host, s.wss_port, s.ws_path, ctx, keepalive, reuse, trusted
                )
            )
            self.ports["wss"] = s.wss_port
        log.info("mqtt_listening", extra={"ports": self.ports, "node": s.node_id})

    def attach_readiness(self, set_ready: Callable[[bool], Awaitable[None]]) -> None:
        """The runtime's hook on gRPC health, for a fence that comes and goes."""
        self._readiness = set_ready

    def _lease_changed(self, fenced: bool) -> None:
        """Fenced (lease.py): NOT_SERVING, so load balancers that check readiness move away;
        unfenced: SERVING again, unless the node is draining or lost its bus for good."""
        if self._readiness is None or (self.unhealthy is not None and self.unhealthy.done()):
            return
        task = asyncio.get_running_loop().create_task(self._readiness(not fenced))
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def _stop_accepting(self) -> None:
        """A drain began: close the listeners (new connections are refused, or go to the
        other workers sharing the ports) and report NOT_SERVING (load balancers move away).
        The open connections stay: the drain closes them at its pace."""
        if self.unhealthy is not None and not self.unhealthy.done():
            self.unhealthy.set_result(DRAINING)
        for srv in self._servers:
            srv.close()
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()  # the listening socket only, not the WebSockets open

    async def _connect_bus(self, queue: QueueClient) -> tuple[Client, Client]:
        """The node's two NATS connections: one without echo (its own publishes do not
        come back), one with (queue groups, where NATS may pick this node's member, and the
        mesh interest ticks); both tell `queue` when they reconnect."""
        s = self._s

        async def reconnected() -> None:
            queue.changed()  # queue notices may have come while NATS was away: read

        async def open_one(name: str, no_echo: bool) -> Client:
            return await connect(
                s.nats_url,
                name,
                no_echo=no_echo,
                on_closed=self._bus_closed,
                on_reconnected=reconnected,
                **s.nats_options(),
            )

        return await open_one(s.node_id, True), await open_one(f"{s.node_id}-shared", False)

    async def _bus_closed(self) -> None:
        """A NATS connection closed for good: this node can no longer reach the mesh. Stop
        taking connections, tell every client 0x89 (Server busy: try again, elsewhere) and
        report NOT_SERVING so the orchestrator replaces the process."""
        if self._stopping or self.unhealthy is None or self.unhealthy.done():
            return
        self.unhealthy.set_result("nats connection closed")
        for srv in self._servers:
            srv.close()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self.node is not None:
            self.node.shed(RC.SERVER_BUSY, "node lost the message bus")

    async def stop(self) -> None:
        self._stopping = True
        if self._reporter is not None:
            self._reporter.cancel()
        if self._bans is not None:
            await self._bans.stop()
        if self.node is not None and self.node.slots is not None:
            await self.node.slots.stop()
        for srv in self._servers:
            srv.close()
        if self.node is not None:
            await self.node.shutdown(min(2.0, self._s.shutdown_grace_s))
        for runner in self._runners:
            await runner.cleanup()
        if self._copies is not None:
            await self._copies.stop()
        if self._rule_feed is not None:
            await self._rule_feed.stop()
        if self.node is not None:
            for nc in {self.node.nc, self.node.nc_shared}:
                if not nc.is_closed:
                    await nc.drain()


def main() -> int:
    return run_service("connection", ConnectionSettings, ConnectionService)
