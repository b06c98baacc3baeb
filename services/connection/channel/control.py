"""The packets and timers that carry no messages: PINGREQ, the client's DISCONNECT, keep alive,
the CONNECT timeout and the control-packet budget."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from services.common.mqtt.packets import Disconnect, Packet, PubAck, PubComp, PubRec, PubRel
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel.outbound import AWAIT_PUBACK, AWAIT_PUBCOMP, AWAIT_PUBREC

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.channel.inbound import InboundPublishes

PINGRESP = b"\xd0\x00"  # the answer to PINGREQ, the same on every level

# The stage of an outbound exchange each client ack moves on (outbound.py).
_ACK_STAGE: Final[dict[type, int]] = {
    PubAck: AWAIT_PUBACK,
    PubRec: AWAIT_PUBREC,
    PubComp: AWAIT_PUBCOMP,
}


class KeepAlive:
    """When the client was last heard from, and how long it may stay silent."""

    __slots__ = ("interval_s", "last_rx", "opened_at")

    def __init__(self, now: float) -> None:
        self.opened_at = now
        self.last_rx = now
        self.interval_s = 0  # 0: no keep alive, the client may stay silent forever

    def deadline(self) -> float:
        """[MQTT-3.1.2-24] silent past one and a half keep-alive intervals after the last
        packet is too long (inf: no keep alive)."""
        return self.last_rx + 1.5 * self.interval_s if self.interval_s else math.inf

    def silent_too_long(self, now: float) -> bool:
        return now > self.deadline()

    def connect_overdue(self, now: float, timeout_s: float) -> bool:
        """No CONNECT within `timeout_s` of the transport opening."""
        return now - self.opened_at > timeout_s


def enforced_keepalive(asked_s: int, level: int, max_s: int) -> int:
    """The keep alive a client is held to from its CONNECT on. MQTT 5 clients are told
    theirs in the CONNACK (`handshake.server_keepalive`), so this is what they asked until
    then. A 3.1/3.1.1 client cannot be told: one asking more than `max_s` is held to `max_s`
    (a silent client is not kept for up to 27 hours); one asking 0 keeps it off, as its
    protocol promises (TCP keep-alive finds its dead peer)."""
    if level < 5 and max_s and asked_s > max_s:
        return max_s
    return asked_s


@dataclass(frozen=True, slots=True)
class Farewell:
    """What a client's DISCONNECT says about the end of its session."""

    discard_will: bool  # [MQTT-3.14.4-3] a normal DISCONNECT discards the will
    session_expiry_s: int | None  # a new Session Expiry Interval; None: keep the current one
    violation: str = ""  # not empty: the DISCONNECT itself broke a rule (a protocol error)


def read_disconnect(p: Disconnect, level: int, connect_session_expiry_s: int | None) -> Farewell:
    """Read the client's DISCONNECT; `connect_session_expiry_s` is what its CONNECT asked."""
    expiry = p.properties.session_expiry_interval
    violation = ""
    if level == 5 and expiry and not connect_session_expiry_s:
        violation = "session expiry set on DISCONNECT after 0"  # [MQTT-3.14.2-2]
    return Farewell(p.reason_code == RC.NORMAL_DISCONNECTION, expiry, violation)


class ControlBudget:
    """The control packets one connection may send (ChannelConfig.control_packets_per_s and
    control_packets_burst): a token bucket. A PUBLISH never comes here; an ack of an exchange
    under way and DISCONNECT are free: their number is bounded by the exchanges. Everything
    else costs a token: each is cheap, but a flood of them (a million PUBACKs of unknown ids
    in a second) would hold the node's event loop for seconds, every other client's traffic
    behind it."""

    __slots__ = ("_at", "_burst", "_rate", "_tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self._rate = rate  # 0: no limit
        self._burst = burst
        self._tokens = float(burst)
        self._at = now

    def allows(
        self, p: Packet, now: float, inflight: dict[int, int], inbound: InboundPublishes
    ) -> bool:
        """False when `p` is one control packet too many. `inflight`: the outbound
        exchanges' stages (Outbound.inflight); `inbound`: the client's QoS 2 publishes."""
        rate = self._rate
        if not rate:
            return True
        t = type(p)
        if t is Disconnect:
            return True
        stage = _ACK_STAGE.get(t)
        if stage is not None:
            # Free only where it moves an exchange on: a repeat, or an ack of another stage,
            # changes nothing and costs a token like any other.
            if inflight.get(p.packet_id) == stage:  # type: ignore[union-attr,arg-type]
                return True
        elif t is PubRel and inbound.awaiting(p.packet_id):  # type: ignore[union-attr,arg-type]
            return True
        # A wall clock stepped back refills nothing, and takes nothing either.
        elapsed = max(0.0, now - self._at)
        tokens = min(self._burst, self._tokens + elapsed * rate)
        self._at = now
        if tokens < 1:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1
        return True
