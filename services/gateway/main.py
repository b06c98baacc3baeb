"""Composition root of the gateway: the only place that reads the environment.

The gateway is a peer of the connection nodes: its publishes go through the router, NATS and
the RULES stream as a node's do (publishing.py), its CoAP clients are clients of their
tenants in the session registry (presence.py), its rate quota is leased from the quota
service (tenant_rates.py), and its counters reach the metrics service. `run_service` gives
it gRPC health (SERVING once its listeners are bound), logging and shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterable

import aiocoap
import grpc
from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.client import connect, drain
from services.common.bus.publisher import ServicePublisher
from services.common.forwarded import TrustedProxies
from services.common.rpc.admin_auth import CachedTokenResolver
from services.common.runtime import run_service
from services.common.tasks import TaskSet
from services.gateway.address_rate import AddressRate
from services.gateway.callers import Callers, LoginCache
from services.gateway.coap_clients import CoapClients
from services.gateway.coap_gateway import CoapGateway, CoapLimits
from services.gateway.coap_server import CoapSite, start_coap
from services.gateway.config import GatewaySettings
from services.gateway.http_api import HttpApi, build_app
from services.gateway.interest import MeshPresence
from services.gateway.message_input import InputLimits
from services.gateway.observing import Observations
from services.gateway.presence import Presence
from services.gateway.publishing import Publishing
from services.gateway.stats import KIND, GatewayStats
from services.gateway.sys_notices import SysNotices
from services.gateway.tenant_rates import TenantRates
from services.metrics.client import MetricsClient, report_every
from services.quota.client import QuotaClient
from services.router.client import RouterClient
from services.rules.client import RuleFeed
from services.session.client import SessionClient
from services.session.token_client import TokenClient

log = logging.getLogger("starling.gateway")

SWEEP_S = 5.0  # how often idle CoAP clients are looked for


class GatewayService:
    def __init__(self, settings: GatewaySettings) -> None:
        self._s = settings
        self._session = SessionClient(settings.session_addr)
        self._tokens = TokenClient(settings.session_addr)
        self._quota = QuotaClient(settings.quota_addr)
        self._router = RouterClient(settings.router_addr)
        self._stats = GatewayStats()
        self._rates = TenantRates(
            quota=self._quota, node_id=settings.node_id, recheck_s=settings.gateway_quota_recheck_s
        )
        self._limits = InputLimits(
            max_payload_bytes=settings.gateway_max_payload_bytes,
            max_bulk=settings.gateway_http_max_bulk,
        )
        self._nc: Client | None = None
        self._runner: web.AppRunner | None = None
        self._coap: aiocoap.Context | None = None
        self._presence: Presence | None = None
        self._clients: CoapClients | None = None
        self._interest: MeshPresence | None = None
        self._publishing: Publishing | None = None
        self._notices: SysNotices | None = None
        self._tasks = TaskSet()

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        return []  # health only

    async def start(self) -> None:
        s = self._s
        self._nc = nc = await connect(s.nats_url, s.node_id, **s.nats_options())
        self._session.use_bus(nc, s.session_subject)
        self._router.use_bus(nc)
        feed = RuleFeed(nc)
        await feed.start()
        publisher = ServicePublisher(nc, self._router, s.node_id, rules=feed)
        self._notices = SysNotices(publisher=publisher, node_id=s.node_id)
        self._publishing = publishing = Publishing(
            publisher=publisher,
            rates=self._rates,
            stats=self._stats,
            node_id=s.node_id,
            timeout_s=s.gateway_publish_timeout_s,
            tracing=s.tracing,
        )
        self._presence = presence = Presence(nc=nc, session=self._session, node_id=s.node_id)
        self._clients = CoapClients(
            presence=presence,
            stats=self._stats,
            notices=self._notices,
            max_clients=s.gateway_coap_clients,
            idle_s=s.gateway_coap_client_idle_s,
        )
        await presence.start(self._clients.kicked, self._clients.held)
        await nc.subscribe(subjects.QUOTA_LIMITS_CHANGED, cb=self._limits_changed)
        await self._start_http(publishing, presence)
        if s.gateway_coap_port >= 0:
            await self._start_coap(nc, publishing)
        metrics = MetricsClient(s.metrics_addr)
        self._tasks.spawn(
            report_every(metrics, s.node_id, self._stats.gather, s.stats_interval_s, KIND),
            "gateway-stats",
        )
        self._tasks.spawn(self._sweep(), "gateway-sweep")

    async def _start_coap(self, nc: Client, publishing: Publishing) -> None:
        s = self._s
        self._interest = MeshPresence(
            nc=nc, node_id=s.node_id, wait_s=s.gateway_mesh_interest_wait_s
        )
        await self._interest.start()
        assert self._clients is not None
        gateway = CoapGateway(
            clients=self._clients,
            observations=Observations(nc=nc, interest=self._interest),
            publishing=publishing,
            rate=AddressRate(s.gateway_coap_messages_per_ip_per_s),
            input_limits=self._limits,
            limits=CoapLimits(
                max_observations=s.gateway_coap_max_observations,
                observations_per_client=s.gateway_coap_observations_per_client,
            ),
            retained=self._router.retained,
        )
        site = CoapSite(gateway=gateway, stats=self._stats)
        self._coap = await start_coap(site, s.gateway_host, s.gateway_coap_port)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            if self._clients is not None:
                await self._clients.sweep()

    async def _start_http(self, publishing: Publishing, presence: Presence) -> None:
        s = self._s
        api = HttpApi(
            callers=Callers(
                operator_token=s.admin_token.get_secret_value(),
                tokens=CachedTokenResolver(self._tokens.resolve, s.admin_token_cache_s),
                presence=presence,
                cache=LoginCache(s.gateway_auth_cache_s, s.gateway_auth_cache_entries),
            ),
            publishing=publishing,
            limits=self._limits,
            address_rate=AddressRate(s.gateway_requests_per_ip_per_s),
            trusted=TrustedProxies.parse(s.gateway_trusted_proxies),
            max_body_bytes=s.gateway_http_max_body_bytes,
        )
        self._runner = web.AppRunner(build_app(api), access_log=None)
        await self._runner.setup()
        if s.gateway_http_port >= 0:
            await web.TCPSite(self._runner, s.gateway_host, s.gateway_http_port).start()
        if s.gateway_https_port >= 0:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(s.tls_cert_file), str(s.tls_key_file))
            site = web.TCPSite(self._runner, s.gateway_host, s.gateway_https_port, ssl_context=ctx)
            await site.start()
        log.info(
            "gateway_listening",
            extra={
                "host": s.gateway_host,
                "http_port": s.gateway_http_port,
                "https_port": s.gateway_https_port,
                "coap_port": s.gateway_coap_port,
            },
        )

    async def _limits_changed(self, msg: Msg) -> None:
        self._rates.limits_changed(msg.data.decode(errors="replace"))

    async def stop(self) -> None:
        await self._tasks.cancel()
        if self._coap is not None:
            await self._coap.shutdown()
        if self._clients is not None:
            await self._clients.close_all()
        if self._interest is not None:
            await self._interest.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._publishing is not None:
            await self._publishing.close()
        if self._notices is not None:
            await self._notices.close()
        if self._presence is not None:
            await self._presence.stop()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await drain(self._nc)
        for client in (self._session, self._tokens, self._quota, self._router):
            with contextlib.suppress(Exception):
                await client.close()


def main() -> int:
    return run_service("gateway", GatewaySettings, GatewayService)
