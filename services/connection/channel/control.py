"""The packets and timers that carry no messages: PINGREQ, the client's DISCONNECT, keep alive
and the CONNECT timeout."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.mqtt.packets import Disconnect
from services.common.mqtt.reason import ReasonCode as RC

PINGRESP = b"\xd0\x00"  # the answer to PINGREQ, the same on every level


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
