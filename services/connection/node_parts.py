"""What a connection node is built from: `NodeSettings` (values from the service's settings)
and `NodeLinks` (its connections and clients to the rest of the mesh), both frozen and
passed by keyword to `Node` (node.py); main.py makes them, tests make their own."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client

from services.common.connect import WILL_STORE_MAX_BYTES
from services.common.refusals import Refusals
from services.connection.channel import ChannelConfig
from services.connection.quota import NodeQuota
from services.connection.routing import Router
from services.connection.subscription_slots import SubscriptionSlots
from services.queue.client import QueueClient
from services.router.client import RouterClient
from services.rules.client import RuleFeed
from services.session.client import SessionClient


def assigned_client_id() -> str:
    return "auto-" + uuid.uuid4().hex  # [MQTT-3.1.3-6]


def _unchanged(fenced: bool) -> None:
    """The default `on_lease_change`: nobody listens."""


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """How the node behaves. `self_fence_s`: fence after that long without an answered
    heartbeat (lease.py; 0: never). `linger_s`/`linger_max_sockets`: how sockets close
    (linger.py). `ack_wait_s`: how long a drain or shutdown waits for the acks a client is
    owed (close_ack_wait_s)."""

    config: ChannelConfig
    tracing: bool = False
    max_connections_per_ip: int = 0
    mesh_interest_window_s: float = 0.0
    will_store_max_bytes: int = WILL_STORE_MAX_BYTES
    self_fence_s: float = 0.0
    linger_s: float = 2.0
    linger_max_sockets: int = 10_000
    ack_wait_s: float = 1.0
    new_client_id: Callable[[], str] = assigned_client_id


@dataclass(frozen=True, slots=True)
class NodeLinks:
    """The node's connections to the mesh. `nc` is connected with no_echo (its own mesh
        publishes never come back); `nc_shared` (default: `nc`) with echo, for queue groups where
        NATS may pick this node's member too. `publish_router`: what QoS>=1 publishes are routed
        by (replica.py's CopyRouter; `router` by default). `quota`: the tenants' rate budgets
        (None: no rate limits). `rule_feed`: where QoS 0 messages the rules read go (QoS>=1 ones
        go through `publish_router`, rules_tap.py), and the auto-subscriptions. `slots`: tenants'
        max_tenant_subscriptions, counted cluster-wide, built over the node's subscription counts
    (tenant -> held here; None: not enforced). `refusals` counts
        what the node refuses; `on_lease_change` hears the node fence and unfence."""

    nc: Client
    session: SessionClient
    nc_shared: Client | None = None
    router: RouterClient | None = None
    queue: QueueClient | None = None
    publish_router: Router | None = None
    quota: NodeQuota | None = None
    rule_feed: RuleFeed | None = None
    slots: Callable[[dict[str, int]], SubscriptionSlots] | None = None
    refusals: Refusals = field(default_factory=Refusals)
    on_lease_change: Callable[[bool], None] = _unchanged
