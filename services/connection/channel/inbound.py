"""PUBLISH from the client, and the acks we owe it: topic aliases in, QoS 2 exactly-once,
PUBACK/PUBREC in receipt order, PUBREL/PUBCOMP.

Invariants:
- A QoS 2 packet id is in `_awaiting_rel` from its first PUBLISH until its PUBREL (or until
  its PUBREC carries an error): a resend in between is answered, never forwarded twice.
- A persistent session's receiver state outlives the connection: `start` takes the ids a
  resumed session still awaits PUBREL for (stored with the session by the node), so a
  reconnect to any node completes the exchange once. A resend of one whose storage was not
  confirmed is routed again under its recorded message id (the queue de-duplicates it); a
  PUBREL yields `ReleaseQos2`, and its PUBCOMP waits for `released` (the id is forgotten
  durably first, so a new message under the id is never taken for a resend).
- Acks go out in the order the PUBLISHes came [MQTT-4.6.0-2], even when some wait for the node
  (`ChannelConfig.defer_publish_acks`): see `PublisherAcks`.
- An MQTT 5 client never has more unacknowledged QoS 1 and 2 publishes with us than the
  Receive Maximum we announced (QoS 1 until its PUBACK is written, QoS 2 until its PUBREL):
  one more is a protocol violation, 0x93 [MQTT-3.3.4-9].
- `$SYS` topics belong to the server: a publish to one is refused (0x87) or, on 3.1/3.1.1,
  acknowledged and dropped.
- A publish over the tenant's (or user's) rate budget (`PublishGate`, a local token-bucket
  check, services/connection/budget.py) is not routed: QoS 0 is dropped (the gate counts it),
  MQTT 5 QoS 1/2 get PUBACK/PUBREC 0x97, and a 3.1/3.1.1 client's QoS 1/2 publish closes
  the connection, since its acks cannot say "refused" and an ack is a promise to deliver
  (docs/quota.md).
- Anything the client got wrong raises `MqttError` with the reason code to close with; the
  channel turns it into DISCONNECT.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final, Protocol

from services.common.acl import AclChecker
from services.common.message import Message, message_properties
from services.common.message_size import message_bytes
from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import ProtocolViolationError, QuotaExceededError
from services.common.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel
from services.common.mqtt.primitives import is_utf8_payload
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import is_sys_topic, validate_topic_name
from services.connection.channel.acks_owed import PublisherAcks
from services.connection.channel.actions import ReleaseQos2
from services.connection.channel.config import ChannelConfig
from services.connection.channel.problems import Problems, describe
from services.connection.channel.subscriptions import SubscriptionQuota

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.budget import DeliveryGate

_ACCEPTED: Final = (0, "")  # `_refusal` of a publish that is routed
# A successful PUBACK/PUBREC without a reason string: four bytes at every level (its type
# and length, the packet id; [MQTT-3.4.2.1]), packed without a packet object.
_PLAIN_ACK: Final = struct.Struct(">HH").pack
_PUBACK_HEAD: Final = 0x4002
_PUBREC_HEAD: Final = 0x5002


class PublishGate(Protocol):
    """A connection's publish budgets (services/connection/budget.py), its tenant's count
    limits (`limits`, None: not known) and its outbound bandwidth budgets (`delivery`)."""

    limits: SubscriptionQuota | None
    delivery: DeliveryGate | None

    def admit(self, nbytes: int) -> bool: ...

    def begin(self) -> None: ...

    def end(self) -> None: ...


class InboundPublishes:
    """The client's PUBLISH, PUBREL and the acks it is owed. Call `start` once the session is
    known, then `receive` for each PUBLISH; `routed` when the node finished a deferred one."""

    __slots__ = (
        "_acks",
        "_acl",
        "_aliases",
        "_awaiting_rel",
        "_client_id",
        "_config",
        "_gate",
        "_level",
        "_out",
        "_persistent",
        "_problems",
        "_releasing",
        "_tenant",
        "_unconfirmed",
    )

    def __init__(
        self, config: ChannelConfig, out: bytearray, acl: AclChecker, problems: Problems
    ) -> None:
        self._config = config
        self._out = out
        self._problems = problems
        self._level = 4
        self._tenant = ""
        self._client_id = ""
        self._acl = acl
        self._aliases: dict[int, str] = {}  # topic alias -> topic name, set by this client
        self._awaiting_rel: set[int] = set()
        self._acks = PublisherAcks()
        self._persistent = False
        # Of a resumed session: ids awaiting PUBREL whose message may not be stored yet ->
        # the message id it was recorded under.
        self._unconfirmed: dict[int, str] = {}
        self._releasing: set[int] = set()  # PUBREL taken, its PUBCOMP waits for `released`
        self._gate: PublishGate | None = None

    @property
    def gate(self) -> PublishGate | None:
        """The publish budgets (None: no rate limits); the channel brackets each read's
        publishes with its `begin`/`end`."""
        return self._gate

    def start(
        self,
        level: int,
        tenant: str,
        client_id: str,
        acl: AclChecker,
        persistent: bool = False,
        awaiting: tuple[tuple[int, str, bool], ...] = (),
        gate: PublishGate | None = None,
    ) -> None:
        """Who publishes: fixed for the life of the connection; a persistent session's
        QoS 2 publishes awaiting PUBREL (packet id, message id, stored); the budgets its
        publishes draw on (None: no rate limits)."""
        self._gate = gate
        self._level = level
        self._tenant = tenant
        self._client_id = client_id
        self._acl = acl
        self._persistent = persistent
        for pid, message_id, stored in awaiting:
            self._awaiting_rel.add(pid)
            if not stored:
                self._unconfirmed[pid] = message_id

    def receive(self, p: Publish, now: float) -> Message | None:
        """A PUBLISH: the message to route (None: nothing to route); its ack is written or
        owed. Raises `MqttError` when the client broke a rule."""
        topic = p.topic
        props = p.properties
        level = self._level
        if props is not EMPTY and level == 5:
            if props.subscription_identifier:  # [MQTT-3.3.4-6] only the server sets them
                raise ProtocolViolationError("subscription identifier in a client's PUBLISH")
            if props.topic_alias is not None:
                topic = self._resolve_alias(props.topic_alias, topic)
        if not topic and level == 5:  # neither a topic name nor an alias (MQTT 5, 3.3.2.3.4)
            raise ProtocolViolationError("PUBLISH with an empty topic and no topic alias")
        validate_topic_name(topic, self._config.topic_limits)
        qos = p.qos
        pid = p.packet_id or 0
        if qos == 2 and pid in self._awaiting_rel:
            return self._resent(p, topic, pid, now)
        if qos and self._window_full(qos):
            # More unacknowledged QoS 1/2 than the Receive Maximum of our CONNACK.
            raise ProtocolViolationError("receive maximum exceeded", RC.RECEIVE_MAXIMUM_EXCEEDED)
        msg = None
        code, text = self._refusal(p, topic, qos, level)
        if not text:  # accepted
            defer = qos > 0 and self._config.defer_publish_acks
            if props is EMPTY:  # the common case: nothing to copy
                msg_props, expires_at = EMPTY, None
            else:
                msg_props, expires_at = message_properties(props), _expires_at(props, now)
            msg = Message(
                self._tenant,
                topic,
                p.payload,
                qos,
                p.retain,
                self._client_id,
                msg_props,
                expires_at,
                now,
                (),
                pid if defer else 0,  # answered by `Channel.publish_routed(pid)` once stored
            )
            if defer:
                self._owe(pid, qos, 0, False)
                return msg
        if qos:
            self._owe(pid, qos, code, True, text)
        return msg

    def _refusal(self, p: Publish, topic: str, qos: int, level: int) -> tuple[int, str]:
        """Why the publish is not routed: (reason code, Reason String), `_ACCEPTED` if it is.
        On 3.1/3.1.1 a refused publish is acknowledged, then dropped (code 0); one over the
        rate budget at QoS>0 raises instead (the connection closes, the client resends)."""
        if topic[0] == "$" and is_sys_topic(topic):
            code = RC.NOT_AUTHORIZED if level == 5 else 0
            return code, "$SYS topics are reserved for the server"
        if not self._acl.can_publish(topic):
            code = RC.NOT_AUTHORIZED if level == 5 else 0
            return code, f"not authorized to publish to {topic}"
        if p.properties.payload_format_indicator == 1 and not is_utf8_payload(p.payload):
            return RC.PAYLOAD_FORMAT_INVALID, "payload is not valid UTF-8"
        gate = self._gate
        if gate is not None and not gate.admit(message_bytes(topic, p.payload)):
            if qos and level < 5:
                raise QuotaExceededError("publish rate quota exceeded")
            return RC.QUOTA_EXCEEDED, "publish rate quota exceeded"
        return _ACCEPTED

    def _resent(self, p: Publish, topic: str, pid: int, now: float) -> Message | None:
        """A QoS 2 publish under an id that awaits its PUBREL: the client resent it."""
        recorded = self._unconfirmed.pop(pid, "") if self._unconfirmed else ""
        if recorded:  # accepted by an earlier connection, maybe not stored yet
            return self._route_again(p, topic, recorded, now)
        self._answer_resend(pid)
        return None

    def routed(self, packet_id: int, reason_code: int) -> None:
        """The node finished routing a deferred publish: its ack, and those behind it, go."""
        if self._level < 5:
            reason_code = 0  # 3.1/3.1.1 acks carry no reason: the client gets a plain ack
        for a in self._acks.settle(packet_id, reason_code):
            self._write_ack(a.packet_id, a.qos, a.reason_code, a.text)

    @property
    def owes_acks(self) -> bool:
        """A PUBACK/PUBREC waits for its publish to be routed, or a PUBCOMP for its release."""
        return self._acks.waiting or bool(self._releasing)

    def awaiting(self, pid: int) -> bool:
        """A QoS 2 publish under this packet id waits for its PUBREL (not one being released:
        a repeated PUBREL changes nothing)."""
        return pid in self._awaiting_rel and pid not in self._releasing

    def on_pubrel(self, p: PubRel) -> ReleaseQos2 | None:
        """Release of a QoS 2 message: it is forwarded already, PUBCOMP ends the exchange
        (for a persistent session once `released` says the release is durable)."""
        pid = p.packet_id
        if pid in self._awaiting_rel:
            if self._persistent:
                if pid in self._releasing:
                    return None  # a repeated PUBREL: its PUBCOMP is on its way
                self._releasing.add(pid)
                return ReleaseQos2(pid)
            self._awaiting_rel.discard(pid)
            self._out += encode(PubComp(pid), self._level)
        else:
            code = RC.PACKET_IDENTIFIER_NOT_FOUND
            self._out += self._problems.encode(PubComp(pid, code), "no QoS 2 publish to release")
        return None

    def released(self, packet_id: int) -> None:
        """The session's stored state forgot `packet_id` (durably): PUBCOMP."""
        if packet_id in self._releasing:
            self._releasing.discard(packet_id)
            self._awaiting_rel.discard(packet_id)
            self._unconfirmed.pop(packet_id, None)
            self._out += encode(PubComp(packet_id), self._level)

    def _route_again(self, p: Publish, topic: str, message_id: str, now: float) -> Message:
        """A resend of a publish an earlier connection accepted (its checks passed then):
        routed under its recorded id, its PUBREC once the store has it."""
        props = p.properties
        if props is EMPTY:
            msg_props, expires_at = EMPTY, None
        else:
            msg_props, expires_at = message_properties(props), _expires_at(props, now)
        pid = p.packet_id or 0
        self._acks.add(pid, 2, 0, False)
        return Message(
            self._tenant,
            topic,
            p.payload,
            2,
            p.retain,
            self._client_id,
            msg_props,
            expires_at,
            now,
            (),
            pid,
            message_id,
        )

    def _resolve_alias(self, alias: int, topic: str) -> str:
        if alias > self._config.topic_alias_maximum:
            raise ProtocolViolationError(  # [MQTT-3.3.2-9]
                "topic alias out of range", RC.TOPIC_ALIAS_INVALID
            )
        if topic:
            self._aliases[alias] = topic  # a topic with an alias (re)defines the alias
            return topic
        known = self._aliases.get(alias, "")
        if not known:
            raise ProtocolViolationError("unknown topic alias")
        return known

    def _answer_resend(self, pid: int) -> None:
        """A QoS 2 PUBLISH whose id awaits PUBREL is a resend: answer it again (unless its
        first PUBREC is still owed) and never forward it twice [MQTT-4.3.3-10]."""
        if not self._acks.owes(pid):
            self._out += encode(PubRec(pid), self._level)

    def _window_full(self, qos: int) -> bool:
        """A new QoS 1/2 publish would exceed the Receive Maximum we announced. 3.1/3.1.1
        clients were told no limit: for them only the QoS 2 state is bounded (by the same
        number), their QoS 1 acks wait at most as long as the router takes."""
        unacked = len(self._awaiting_rel)
        if self._level == 5:
            unacked += self._acks.qos1_waiting
        elif qos == 1:
            return False
        return unacked >= self._config.receive_maximum

    def _owe(self, pid: int, qos: int, code: int, ready: bool, text: str = "") -> None:
        if qos == 2 and code < 0x80:
            self._awaiting_rel.add(pid)
        if self._acks.add(pid, qos, code, ready, text):
            self._write_ack(pid, qos, code, text)

    def _write_ack(self, pid: int, qos: int, code: int, text: str = "") -> None:
        if not code and not text:  # the usual one
            self._out += _PLAIN_ACK(_PUBACK_HEAD if qos == 1 else _PUBREC_HEAD, pid)
            return
        if code >= 0x80 and not text:
            text = describe(code)
        if qos == 1:
            self._out += self._problems.encode(PubAck(pid, code), text)
            return
        if code >= 0x80:
            self._awaiting_rel.discard(pid)  # [MQTT-4.3.3-9] a resend of it is a new message
        self._out += self._problems.encode(PubRec(pid, code), text)


def _expires_at(props: Properties, now: float) -> float | None:
    interval = props.message_expiry_interval
    return None if interval is None else now + interval
