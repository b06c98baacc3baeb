"""What every part of a `Channel` shares: the `State` it moves through and `ChannelBase`, the
fields core.py's `Channel` holds (its `__slots__`), declared once for the modules that define
its behaviour (opening.py, closing.py, core.py), each a base of the next.

`state` only moves forward: AWAIT_CONNECT -> AUTHENTICATING -> (ACCEPTED ->) CONNECTED ->
CLOSED, and any state may go straight to CLOSED. Nothing is written or returned after CLOSED.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING

from services.common.acl import AclChecker
from services.common.mqtt.decoder import Decoder
from services.common.mqtt.packets import Will
from services.connection.channel.config import ChannelConfig
from services.connection.channel.control import ControlBudget, KeepAlive
from services.connection.channel.enhanced_auth import AuthExchange
from services.connection.channel.handshake import Handshake
from services.connection.channel.outbound import Outbound
from services.connection.channel.problems import Problems
from services.connection.channel.subscriptions import ClientSubscriptions

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.channel.hooks import DeliveryHooks
    from services.connection.channel.inbound import InboundPublishes, PublishGate


class State(IntEnum):
    AWAIT_CONNECT = 1
    AUTHENTICATING = 2
    ACCEPTED = 3  # the session exists; the CONNACK waits for the auto-subscriptions
    CONNECTED = 4
    CLOSED = 5


# Packets that come meanwhile are held for after the CONNACK.
BEFORE_CONNACK = frozenset({State.AUTHENTICATING, State.ACCEPTED})


class ChannelBase:
    """The fields of a channel (set by `Channel.__init__`, which documents them)."""

    __slots__ = (
        "_auth",
        "_control",
        "_decoder",
        "_gates",
        "_handshake",
        "_inbound",
        "_keepalive",
        "_on_limit",
        "_problems",
        "_subscriptions",
        "acl",
        "bytes_received",
        "bytes_sent",
        "client_id",
        "config",
        "disconnect_expiry_s",
        "epoch",
        "incarnation",
        "level",
        "normal_disconnect",
        "on_resume",
        "out",
        "outbound",
        "packets_received",
        "peer",
        "persistent",
        "qos2_fence",
        "session_expiry_s",
        "state",
        "tenant",
        "username",
        "will",
    )

    config: ChannelConfig
    peer: str
    state: State
    level: int
    out: bytearray
    bytes_received: int
    packets_received: int
    bytes_sent: int
    client_id: str
    username: str
    tenant: str
    epoch: int
    qos2_fence: int
    incarnation: int
    persistent: bool
    session_expiry_s: int
    disconnect_expiry_s: int | None
    will: Will | None
    normal_disconnect: bool
    acl: AclChecker
    on_resume: Callable[[], None]
    outbound: Outbound
    _gates: Callable[[str, str, DeliveryHooks], PublishGate | None] | None
    _on_limit: Callable[[str, str], None]
    _control: ControlBudget
    _decoder: Decoder
    _handshake: Handshake
    _problems: Problems
    _inbound: InboundPublishes
    _subscriptions: ClientSubscriptions
    _keepalive: KeepAlive
    _auth: AuthExchange

    def _limit(self, name: str) -> None:
        """Report a configured limit the client ran into (the node counts them)."""
        self._on_limit(name, self.tenant)
