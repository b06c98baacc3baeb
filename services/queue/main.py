"""Composition root of the queue service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterable
from functools import partial

import grpc
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.client import LateClient, connect, drain
from services.common.bus.large import limit
from services.common.bus.unary import (
    ACK_SUBJECT,
    APPEND_SUBJECT,
    DIRECT_APPEND_SUBJECT,
    FENCE_ROUTES_SUBJECT,
    QUEUE_OWNERS_SUBJECT,
    READ_SUBJECT,
    RELEASED_SUBJECT,
    UnaryServer,
    instance_subject,
    servicer_handler,
)
from services.common.dependencies import redis_ready
from services.common.limits_copies import LimitsCopies
from services.common.redis_client import redis_client
from services.common.refusals import register_refusal_metrics
from services.common.runtime import run_service
from services.common.store.open import open_queue_store
from services.metrics.client import MetricsClient, TenantCounters, report_every
from services.queue.api import QueueAdminApi, QueueApi
from services.queue.config import QueueSettings
from services.queue.consuming import forget_partitions
from services.queue.depths import QueueDepths
from services.queue.leases import LeaseTable
from services.queue.link import HEADER_BYTES, METHODS, Handler, LinkServer
from services.queue.ownership import Partitions
from services.queue.readers import Readers
from services.quota.client import QuotaClient
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

log = logging.getLogger("starling.queue")

DEPTH_CHECK_S = 1.0  # how often the depth scanner looks for gained partitions


class QueueService:
    def __init__(self, settings: QueueSettings) -> None:
        self._s = settings
        self._store = open_queue_store(settings)
        # Unique per process: a restarted instance never renews its predecessor's leases
        # (they run out), and callers never take one incarnation's claims for another's.
        self.instance_id = f"{settings.node_id}-{uuid.uuid4().hex[:8]}"
        self._redis = redis_client(settings)
        self._nats = LateClient()
        readers = Readers()
        # Entries waiting per tenant in this instance's partitions (reported to metrics).
        depths = QueueDepths(settings.queue_partitions, lambda: self._parts.epochs.keys())
        self._parts = self._partitions(readers, depths)
        self._leasing: asyncio.Task[None] | None = None
        # Tenants' max_queue_depth: copies of the quota service's limits.
        self._limits = (
            LimitsCopies(QuotaClient(settings.quota_addr, timeout_s=1.0))
            if settings.quota_enabled
            else None
        )
        # LateClient stands in for the NATS client until start() connects it.
        self._api = QueueApi(
            store=self._store,
            parts=self._parts,
            settings=self._s,
            nats=self._nats,  # type: ignore[arg-type]
            readers=readers,
            depths=depths,
            limits=self._limits,
        )
        register_refusal_metrics(self._api.refusals, "starling.queue")
        self._servers: list[UnaryServer] = []
        self._link: LinkServer | None = None
        self._reporter: asyncio.Task[None] | None = None
        self._depth_scans: asyncio.Task[None] | None = None
        self._sharing: asyncio.Task[None] | None = None

    def _partitions(self, readers: Readers, depths: QueueDepths) -> Partitions:
        """This instance's partitions, leased in Redis; losing one forgets its readers and
        depths, and the owners' announcement goes out on NATS."""
        s, count = self._s, self._s.queue_partitions
        leases = LeaseTable(
            self._redis,
            self.instance_id,
            count,
            s.queue_lease_ttl_ms,
            s.queue_lease_key_prefix,
        )
        return Partitions(
            settings=s,
            instance_id=self.instance_id,
            leases=leases,
            store=self._store,
            grpc_address=_advertised(s),
            on_lost=partial(forget_partitions, readers=readers, depths=depths, count=count),
            publish=lambda data: self._nats.publish(QUEUE_OWNERS_SUBJECT, data),
        )

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_QueueServiceServicer_to_server(self._api, server)
        pb_grpc.add_QueueAdminServiceServicer_to_server(QueueAdminApi(self._store), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        self._nats.nc = await connect(self._s.nats_url, self._s.node_id, **self._s.nats_options())
        nc = self._nats.nc
        if self._limits is not None:
            await self._limits.start(nc)
        # The leases live in Redis: its first round needs it.
        await redis_ready(self._redis, self._s.dependency_wait_s)
        # The first round before serving: alone, this instance owns every partition when
        # it reports SERVING; beside others it takes its share as they shed theirs.
        await self._parts.tick()
        # The partitions' depths and bytes loaded before serving: a restarted instance
        # checks max_queued_bytes against what its queues hold from its first append.
        try:
            await self._api.depths.scan(self._store)
        except Exception as exc:  # the store is away: the scan loop tries again
            log.warning("queue_depth_scan_failed", extra={"error": repr(exc)})
        on_link = await self._serve_over_nats(nc)
        if self._s.link_enabled:
            await self._start_link(on_link, limit(nc))
        await self._parts.announce()
        self._leasing = asyncio.create_task(self._parts.run(), name="queue-leases")
        self._depth_scans = asyncio.create_task(self._scan_depths(), name="queue-depths")
        await nc.subscribe(subjects.QUEUED_BYTES, cb=self._on_peer_bytes)
        self._sharing = asyncio.create_task(self._share_bytes(), name="queue-bytes")
        self._reporter = asyncio.create_task(
            report_every(
                MetricsClient(self._s.metrics_addr),
                f"queue:{self._s.node_id}",
                self._figures,
                self._s.stats_interval_s,
                kind="queue",
            )
        )

    async def _serve_over_nats(self, nc: Client) -> dict[int, Handler]:
        """The persistent path's calls come over NATS too: on the shared subjects (a caller
        that knows no owner yet; any instance) and on this instance's own ones. Answers the
        handlers the queue link serves as well."""
        api = self._api
        on_link: dict[int, Handler] = {}
        for subject, method, request in (
            (APPEND_SUBJECT, api.Append, pb.AppendRequest),
            (DIRECT_APPEND_SUBJECT, api.DirectAppend, pb.AppendRequest),
            (READ_SUBJECT, api.Read, pb.ReadRequest),
            (ACK_SUBJECT, api.Ack, pb.AckRequest),
            (RELEASED_SUBJECT, api.MarkReleased, pb.MarkReleasedRequest),
        ):
            handler = servicer_handler(method, request)
            if subject in METHODS:
                on_link[METHODS[subject]] = handler
            self._servers.append(UnaryServer(nc, subject, "queue", handler))
            own = instance_subject(subject, self.instance_id)
            self._servers.append(UnaryServer(nc, own, "", handler))
        # Every instance must learn a fenced version: no queue group.
        self._servers.append(
            UnaryServer(
                nc,
                FENCE_ROUTES_SUBJECT,
                "",
                servicer_handler(api.FenceRoutes, pb.FenceRoutesRequest),
            )
        )
        for server in self._servers:
            await server.start()
        return on_link

    async def _start_link(self, handlers: dict[int, Handler], nats_limit: int) -> None:
        """Serve the queue link, announced with the partitions from now on. A frame holds
        what one NATS message holds, as NATS is the link's fallback."""
        s = self._s
        secret = s.mesh_secret.get_secret_value() if s.mesh_auth == "secret" else None
        self._link = LinkServer(handlers, secret, nats_limit + HEADER_BYTES + 1)
        await self._link.start(s.grpc_host, s.link_port)
        self._parts.link_address = _link_advertised(s, self._link.port)

    def _figures(self) -> list[TenantCounters]:
        """Per tenant: this instance's drops by the depth limit and refusals by a tenant's
        max_queue_depth since it started, and the entries waiting in the queues of the
        partitions it owns (services/queue/depths.py)."""
        dropped = self._api.dropped_by_tenant
        refused = self._api.refusals.quota_by_tenant()
        depths = self._api.depths.by_tenant()
        return [
            TenantCounters(
                tenant=t,
                queue_dropped=dropped.get(t, 0),
                quota_refusals=refused.get(t, 0),
                queue_depth=depths.get(t, 0),
            )
            for t in sorted({*dropped, *refused, *depths})
        ]

    async def _scan_depths(self) -> None:
        """The depth scans: at start, when partitions were gained, every resync period."""
        depths = self._api.depths
        last = -1e9
        while True:
            if depths.needs_scan() or time.monotonic() - last >= self._s.queue_depth_resync_s:
                try:
                    await depths.scan(self._store)
                    last = time.monotonic()
                except Exception as exc:  # the store is away: try again next round
                    log.warning("queue_depth_scan_failed", extra={"error": repr(exc)})
            await asyncio.sleep(DEPTH_CHECK_S)

    async def _share_bytes(self) -> None:
        """Announce this instance's bytes per tenant every period (services/queue/depths.py);
        also when it holds none, so the others stop counting what it held."""
        while True:
            if self._nats.nc is not None:
                figures = pb.QueuedBytes(
                    instance_id=self.instance_id,
                    bytes_by_tenant=self._api.depths.bytes_by_tenant(),
                )
                try:
                    await self._nats.nc.publish(subjects.QUEUED_BYTES, figures.SerializeToString())
                except Exception as exc:  # NATS away: the next period tries again
                    log.debug("queued_bytes_share_failed", extra={"error": repr(exc)})
            await asyncio.sleep(self._s.queued_bytes_share_s)

    async def _on_peer_bytes(self, msg: Msg) -> None:
        try:
            figures = pb.QueuedBytes.FromString(msg.data)
        except Exception:  # not ours to crash on; logged
            log.warning("queued_bytes_undecodable")
            return
        if figures.instance_id and figures.instance_id != self.instance_id:
            self._api.depths.peer(figures.instance_id, dict(figures.bytes_by_tenant))

    async def stop(self) -> None:
        if self._sharing is not None:
            self._sharing.cancel()
        if self._reporter is not None:
            self._reporter.cancel()
        if self._depth_scans is not None:
            self._depth_scans.cancel()
        for server in self._servers:
            await server.stop()
        if self._link is not None:
            await self._link.stop(self._s.shutdown_grace_s)
        if self._leasing is not None:
            self._leasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._leasing
            await self._parts.leave()
        if self._limits is not None:
            await self._limits.stop()
        if self._nats.nc is not None:
            await drain(self._nats.nc)
        await self._store.close()
        await self._redis.aclose()


def _advertised(settings: QueueSettings) -> str:
    """Where callers reach this instance's gRPC ("" when the port is picked at bind time:
    they use their configured queue address)."""
    if settings.grpc_advertise_address:
        return settings.grpc_advertise_address
    if not settings.grpc_port:
        return ""
    return f"{_reachable(settings.grpc_host)}:{settings.grpc_port}"


def _link_advertised(settings: QueueSettings, port: int) -> str:
    """Where nodes reach this instance's queue link (bound on grpc_host, at `port`)."""
    if settings.link_advertise_address:
        return settings.link_advertise_address
    host = _reachable(settings.grpc_host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reachable(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        # Bound on every interface (a container): this host's address (a pod's IP).
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return socket.gethostname()
    return host


def main() -> int:
    return run_service("queue", QueueSettings, QueueService)
