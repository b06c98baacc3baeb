"""CONNECT in, CONNACK out: what a channel checks itself before asking the session service,
the CONNACK it answers with once the service decided, and the packets that arrive meanwhile.

The session service decides who may connect (`ConnectOutcome`); the channel refuses alone only
what breaks the protocol or our limits, with the CONNACK reason code that says why.
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.connect import ConnectOutcome
from services.common.mqtt.errors import MqttError
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    Packet,
    Publish,
    Subscribe,
    Unsubscribe,
)
from services.common.mqtt.primitives import is_utf8_payload
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import validate_topic_name
from services.connection.channel.config import ChannelConfig


class Handshake:
    """The CONNECT being answered and the packets held until its answer (`hold`, then
    `release_held` once authenticated)."""

    __slots__ = (
        "_config",
        "_connack",
        "_connack_since",
        "_held",
        "_held_bytes",
        "_new_client_id",
        "connect",
        "server_reference",
    )

    def __init__(self, config: ChannelConfig, new_client_id: Callable[[], str]) -> None:
        self._config = config
        self._new_client_id = new_client_id
        self._held_bytes = 0
        self._held: list[Packet] | None = None  # created on first use: most clients wait
        self.connect: Connect | None = None
        self.server_reference = ""  # where a redirected client should go instead
        self._connack = b""  # the accepting CONNACK, while it waits (`hold_connack`)
        self._connack_since = 0.0

    def begin(self, p: Connect) -> tuple[str, int]:
        """Check a CONNECT: (the client id to use, 0), or ("", the refusing reason code)."""
        code = refusal(p, self._config)
        if not code:
            code = self._redirect(p)
        if code:
            return "", code
        self.connect = p
        # [MQTT-3.1.3-6] an empty client id gets one assigned (allowed with a clean start)
        return p.client_id or self._new_client_id(), 0

    def _redirect(self, p: Connect) -> int:
        """0x9C/0x9D when the client's tenant is served elsewhere (`ChannelConfig.redirects`).

        Decided before authentication, from the tenant the user name names, so a redirected
        client leaves no trace here (no registration, no session touched)."""
        redirect = self._config.redirects.get(tenant_of(p.username or ""))
        if redirect is None:
            return 0
        self.server_reference, moved = redirect
        return RC.SERVER_MOVED if moved else RC.USE_ANOTHER_SERVER

    def hold(self, p: Packet) -> bool:
        """Keep a packet that came before the CONNACK; False when too many wait already (in
        packets, or in bytes: together no more than one CONNECT may be, so a client cannot
        make the node hold more before it is authenticated than the pre-CONNACK limit)."""
        held = self._held
        if held is None:
            held = self._held = []
            self._held_bytes = 0
        self._held_bytes += _weight(p)
        if (
            len(held) >= self._config.max_held_packets
            or self._held_bytes > self._config.max_connect_packet_size_bytes
        ):
            return False
        held.append(p)
        return True

    def release_held(self) -> list[Packet]:
        """The held packets, in the order they came, to handle now."""
        held, self._held = self._held, None
        return held or []

    def hold_connack(self, connack: bytes, now: float) -> None:
        """Keep the accepting CONNACK (encoded) until `take_connack`."""
        self._connack = connack
        self._connack_since = now

    def take_connack(self) -> bytes:
        connack, self._connack = self._connack, b""
        return connack

    def connack_overdue(self, now: float, timeout_s: float) -> bool:
        """The held CONNACK has waited longer than `timeout_s`."""
        return now - self._connack_since > timeout_s

    def refused(self, code: int) -> ConnAck:
        """The MQTT 5 CONNACK refusing the CONNECT with `code` (a redirect names the server)."""
        ref = self.server_reference
        if ref and code in (RC.USE_ANOTHER_SERVER, RC.SERVER_MOVED):
            return ConnAck(False, code, Properties(server_reference=ref))
        return ConnAck(False, code)

    def connack(self, outcome: ConnectOutcome, client_id: str) -> tuple[ConnAck, int | None]:
        """The CONNACK accepting the CONNECT, and the keep alive the server imposes (None:
        the client's)."""
        p = self.connect
        assert p is not None, "connack before begin"
        if p.protocol_level < 5:
            # MQTT 3.1 has no Session Present flag: the byte must be 0.
            return ConnAck(outcome.session_present and p.protocol_level == 4, 0, EMPTY), None
        cfg = self._config
        keepalive = server_keepalive(p.keepalive_s, cfg.max_keepalive_s, cfg.server_keepalive_s)
        asked_expiry_s = p.properties.session_expiry_interval or 0
        props = Properties(
            assigned_client_identifier=client_id if not p.client_id else None,
            receive_maximum=cfg.receive_maximum,
            topic_alias_maximum=cfg.topic_alias_maximum,
            maximum_packet_size=cfg.max_packet_size_bytes,
            server_keep_alive=keepalive,
            authentication_method=p.properties.authentication_method,
            authentication_data=outcome.auth_data,
            # Only when the server uses another value than the client asked for.
            session_expiry_interval=(
                outcome.session_expiry_s if outcome.session_expiry_s != asked_expiry_s else None
            ),
            response_information=(
                response_information(cfg.response_information, client_id)
                if p.properties.request_response_information
                else None
            ),
        )
        return ConnAck(outcome.session_present, 0, props), keepalive


def refusal(p: Connect, config: ChannelConfig) -> int:
    """0, or the CONNACK reason code that refuses `p` before asking anyone (the first of
    these that applies)."""
    level = p.protocol_level
    # An authentication method is the session service's to accept or refuse (0x8C).
    if len(p.client_id) > config.max_client_id_length:
        return RC.CLIENT_IDENTIFIER_NOT_VALID
    if not p.client_id and (level == 3 or (level == 4 and not p.clean_start)):
        return RC.CLIENT_IDENTIFIER_NOT_VALID  # [MQTT-3.1.3-8]
    will = p.will
    if will is None:
        return 0
    if not will.topic:
        return RC.PROTOCOL_ERROR  # [MQTT-3.1.3-11] a will topic is a topic name [MQTT-4.7.3-1]
    if will.properties.payload_format_indicator == 1 and not is_utf8_payload(will.payload):
        return RC.PAYLOAD_FORMAT_INVALID
    try:
        validate_topic_name(will.topic, config.topic_limits)
    except MqttError:
        return RC.TOPIC_NAME_INVALID
    return 0


def server_keepalive(asked_s: int, max_s: int, zero_s: int) -> int | None:
    """The Server Keep Alive to impose on an MQTT 5 client (None: accept what it asked):
    `zero_s` (at most `max_s`) when it asked for none (0), `max_s` when it asked for more."""
    if asked_s == 0:
        return (min(zero_s, max_s) if max_s else zero_s) or None
    if max_s and asked_s > max_s:
        return max_s
    return None


def response_information(template: str, client_id: str) -> str | None:
    """The Response Information for a client that asked for it (None: we have none for it).
    `{client_id}` in `template` becomes the client's id; a result that is no valid topic name
    (a client id with `+`, `#`...) is not offered, since the client could not publish to it."""
    if not template:
        return None
    topic = template.replace("{client_id}", client_id)
    try:
        validate_topic_name(topic)
    except MqttError:
        return None
    return topic


def tenant_of(username: str) -> str:
    """The tenant a user name names: `acme/alice` -> `acme`; no slash: `default` (the rule of
    the session service's authenticator)."""
    tenant, slash, _ = username.partition("/")
    return tenant if slash else "default"


def _weight(p: Packet) -> int:
    """Roughly what a held packet costs: its payload, topic and filters."""
    if isinstance(p, Publish):
        return len(p.payload) + len(p.topic) + 16
    if isinstance(p, Subscribe):
        return sum(len(s.filter) + 8 for s in p.subscriptions) + 16
    if isinstance(p, Unsubscribe):
        return sum(len(f) + 8 for f in p.filters) + 16
    return 16
