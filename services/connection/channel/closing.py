"""How a channel closes: server-initiated DISCONNECT, refusals of the CONNECT, the client's
broken rules (`MqttError` with its reason code), and the timers that close it (keep alive,
CONNECT timeout, slow consumer, auto-subscription timeout).

Only this connection closes: DISCONNECT with the code on MQTT 5 (CONNACK with it while the
session does not exist yet), a plain close on 3.1/3.1.1 (which have no code for a protocol
error: no CONNACK at all [MQTT-3.1.4-1]). A `Close` is always the last action of a call.
"""

from __future__ import annotations

import math

from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import (
    MqttError,
    PacketTooLargeError,
    QuotaExceededError,
    UnsupportedProtocolVersionError,
)
from services.common.mqtt.packets import ConnAck, Disconnect
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import validate_topic_name
from services.connection.channel.actions import Action, Close
from services.connection.channel.problems import describe
from services.connection.channel.state import BEFORE_CONNACK, ChannelBase, State

_V3_UNACCEPTABLE_PROTOCOL = b"\x20\x02\x00\x01"  # CONNACK with 3.1.1 return code 1
# 3.1/3.1.1 have no return code for these: a CONNECT that breaks them is closed without a
# CONNACK [MQTT-3.1.4-1] (return code 3, "server unavailable", would have the client retry for
# ever). TOPIC_NAME_INVALID: a will topic with a wildcard, or over the topic limits.
_V3_CLOSE_ONLY = frozenset({RC.MALFORMED_PACKET, RC.PROTOCOL_ERROR, RC.TOPIC_NAME_INVALID})
_REDIRECTS = frozenset({RC.USE_ANOTHER_SERVER, RC.SERVER_MOVED})
# Decoder limit names -> the settings that set them (what `on_limit` reports).
_DECODER_LIMITS = {"max_topic_filters": "max_filters_per_subscribe"}


class ChannelClosing(ChannelBase):
    """The closing half of `Channel` (core.py)."""

    __slots__ = ()

    def disconnect(self, code: int, reason: str, server_reference: str = "") -> list[Action]:
        """Server-initiated close: DISCONNECT(code) on MQTT 5, then close. With
        `server_reference` (0x9C Use another server, 0x9D Server moved) the DISCONNECT names
        where to go [MQTT-3.14.2.2.5]; a client still authenticating gets it in its CONNACK."""
        if self.state is State.CLOSED:
            return []
        if self.state in BEFORE_CONNACK and code in _REDIRECTS:
            # Refused before it began: CONNACK naming the server (3.1.1: return code 3).
            self._handshake.server_reference = server_reference
            self.will = None  # a refused connection leaves no will
            return [self._refuse(code)]
        return [self._shut(code, reason, server_reference)]

    def tick(self, now: float) -> list[Action]:
        """Close a client silent for too long, one that never sent CONNECT, or one that has
        not read from its socket for `slow_consumer_timeout_s`."""
        state = self.state
        if state is State.CONNECTED and self._keepalive.silent_too_long(now):
            return [self._shut(RC.KEEP_ALIVE_TIMEOUT, "keep alive timeout")]
        if now > self._congestion_deadline():
            # It has not read what we sent for that long: stop holding buffers for it (a
            # persistent session's messages wait in its queue for the next connection).
            return [self._shut(RC.QUOTA_EXCEEDED, "slow consumer: not reading")]
        timeout_s = self.config.connect_timeout_s
        if state is State.AWAIT_CONNECT and self._keepalive.connect_overdue(now, timeout_s):
            self._limit("connect_timeout_s")
            return [self._close(RC.MAXIMUM_CONNECT_TIME, "no CONNECT in time")]
        if state is State.AUTHENTICATING and self._auth.overdue(now, timeout_s):
            return [self._close(RC.MAXIMUM_CONNECT_TIME, "no AUTH in time")]
        if state is State.ACCEPTED and self._handshake.connack_overdue(
            now, self.config.auto_subscribe_timeout_s
        ):
            # The mesh did not confirm them in time: the client retries (see `auto_subscribed`).
            self._limit("auto_subscribe_timeout_s")
            self.will = None
            return [self._refuse(RC.SERVER_UNAVAILABLE)]
        return []

    def next_check(self, now: float) -> float:
        """When `tick` may next have something to do, if nothing else happens to this
        channel: `now` during the handshake (every tick), else the end of its keep-alive
        (each packet moves it later, so a look then may find it not yet due) or of its
        slow-consumer timeout, whichever comes first (inf: neither). A congestion that
        starts later asks the sweeper for a look itself (Conn.writable)."""
        if self.state is not State.CONNECTED:
            return now
        return min(self._keepalive.deadline(), self._congestion_deadline())

    def _congestion_deadline(self) -> float:
        """A client that has not read what we sent for `slow_consumer_timeout_s` is closed
        (inf: not congested)."""
        since = self.outbound.congested_since
        return since + self.config.slow_consumer_timeout_s if since else math.inf

    def connection_lost(self) -> None:
        """The transport is gone (either side closed it)."""
        self.state = State.CLOSED

    def _release_connack(self) -> None:
        """ACCEPTED -> CONNECTED: write the CONNACK that waited."""
        self.out += self._handshake.take_connack()
        self.state = State.CONNECTED

    def _refuse(self, code: int, why: str = "") -> Close:
        """Refuse the CONNECT: CONNACK with `code` (the v3 return code on 3.1/3.1.1, which
        close without CONNACK on a protocol error [MQTT-3.1.4-1]: they have no code for it);
        `why`: its Reason String (MQTT 5), by default the code's description."""
        self.state = State.AUTHENTICATING  # so `_shut` answers MQTT 5 with a CONNACK
        if self.level < 5:
            if code in _V3_CLOSE_ONLY:
                return self._close(code, describe(code))
            self.out += encode(ConnAck(False, code), self.level)
        return self._shut(code, why or describe(code))

    def _fail(self, exc: MqttError) -> Close:
        """The client broke a rule (`exc` says which): close with its reason code."""
        self._count_limit(exc)
        if self.state is State.AWAIT_CONNECT:
            if isinstance(exc.cause, UnsupportedProtocolVersionError):
                self.out += _V3_UNACCEPTABLE_PROTOCOL  # [MQTT-3.1.2-2] return code 1, then close
            elif self._decoder.protocol_level == 5 and isinstance(
                exc.cause, PacketTooLargeError | QuotaExceededError
            ):
                # A CONNECT over our limits that says MQTT 5: CONNACK 0x95 / 0x97 tells the
                # client why before the close [MQTT-4.13.1-1].
                self.out += encode(ConnAck(False, exc.reason_code), 5)
            return self._close(exc.reason_code, str(exc))
        return self._shut(exc.reason_code, str(exc))

    def _count_limit(self, exc: MqttError) -> None:
        """Report the configured limit `exc` enforces, if any."""
        limit = exc.limit
        if limit == "max_packet_size" and self.state is not State.CONNECTED:
            limit = "max_connect_packet_size_bytes"  # the decoder's size before CONNACK
        elif limit == "max_packet_size":
            limit = "max_packet_size_bytes"
        if limit:
            self._limit(_DECODER_LIMITS.get(limit, limit))

    def _count_will_topic_limit(self, topic: str) -> None:
        """The will topic was refused: report it if a length/levels limit refused it."""
        try:
            validate_topic_name(topic, self.config.topic_limits)
        except MqttError as exc:
            self._count_limit(exc)

    def _shut(self, code: int, reason: str, server_reference: str = "") -> Close:
        """Tell an MQTT 5 client why (DISCONNECT, or CONNACK before the session exists),
        then close. Not for a CLOSED channel."""
        if self.state is State.ACCEPTED:
            self._release_connack()  # the session exists: CONNACK, then DISCONNECT
        if self.level == 5:
            problems = self._problems
            if self.state is State.CONNECTED:
                props = Properties(server_reference=server_reference) if server_reference else EMPTY
                self.out += problems.encode(Disconnect(code, props), reason, always=True)
            elif self.state is State.AUTHENTICATING and code >= 0x80:
                self.out += problems.encode(self._handshake.refused(code), reason, always=True)
        return self._close(code, reason)

    def _close(self, code: int, reason: str) -> Close:
        self.state = State.CLOSED
        return Close(code, reason)
