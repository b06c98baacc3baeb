"""Broker-to-client delivery for one connection: inflight window, bounded queue, topic aliases.

Invariants:
- At most `receive_maximum` QoS 1/2 PUBLISHes are unacknowledged at once [MQTT-3.3.4-9];
  further ones wait in `pending`, which is bounded; what does not fit is dropped and counted.
- QoS 0 is never queued: it is written at once, or dropped when the transport is congested.
- A PUBLISH larger than the client's maximum packet size is discarded as if sent
  [MQTT-3.1.2-25].
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from services.common.mqtt.encoder import encode, encode_properties
from services.common.mqtt.packets import PubRel
from services.common.mqtt.primitives import encode_varint
from services.common.mqtt.properties import EMPTY
from services.connection.actions import Message

# inflight stage
AWAIT_PUBACK = 1
AWAIT_PUBREC = 2
AWAIT_PUBCOMP = 3

# (message, qos, retain, subscription ids, origin); origin marks shared-subscription
# deliveries so they can be handed to another member if this client leaves unacked.
Pending = tuple[Message, int, bool, tuple[int, ...], object]


class Outbound:
    __slots__ = (
        "_alias",
        "_next_pid",
        "alias_max",
        "completed",
        "congested",
        "dropped",
        "expired",
        "inflight",
        "level",
        "max_packet_size",
        "max_queued",
        "out",
        "pending",
        "receive_maximum",
        "released",
        "sent",
        "shared",
        "track_completions",
    )

    def __init__(
        self,
        out: bytearray,
        level: int,
        receive_maximum: int,
        max_packet_size: int,
        alias_max: int,
        max_queued: int,
    ) -> None:
        self.out = out
        self.level = level
        self.receive_maximum = receive_maximum
        self.max_packet_size = max_packet_size
        self.alias_max = alias_max
        self.max_queued = max_queued
        self.inflight: dict[int, int] = {}
        # Created on first use: an empty deque costs 760 bytes per idle connection.
        self.pending: deque[Pending] | None = None
        self._alias: dict[str, int] = {}
        self._next_pid = 0
        self.congested = False
        self.sent = 0
        self.dropped = 0
        self.expired = 0
        # Packet ids whose delivery finished (PUBACK/PUBCOMP, or discarded as too large), and
        # ids the client PUBREC'd: a persistent session reports them to its queue.
        self.completed: list[int] = []
        self.released: list[int] = []
        self.track_completions = False  # only a persistent session reports to its queue
        # packet id -> origin of an unacknowledged shared-subscription delivery
        self.shared: dict[int, object] | None = None

    def deliver_stored(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        pid: int,
        dup: bool,
        now: float,
    ) -> bool:
        """A queued entry of a persistent session, under the packet id its queue seq gives.

        Returns False when it cannot be sent (expired, or too large for the client): the
        caller treats it as done [MQTT-3.1.2-25]."""
        if msg.expires_at is not None and msg.expires_at <= now:
            self.expired += 1
            return False
        if not self._write(msg, qos, retain, sub_ids, pid, now, dup):
            return False
        self.inflight[pid] = AWAIT_PUBACK if qos == 1 else AWAIT_PUBREC
        return True

    def resend_pubrel(self, pid: int) -> None:
        """Outbound QoS 2 after a reconnect: the client already has the message."""
        self.inflight[pid] = AWAIT_PUBCOMP
        self.out += encode(PubRel(pid), self.level)

    @property
    def free_window(self) -> int:
        return max(0, self.receive_maximum - len(self.inflight))

    def deliver(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
        origin: object = None,
    ) -> None:
        if msg.expires_at is not None and msg.expires_at <= now:
            self.expired += 1
            return
        if qos == 0:
            if self.congested:
                self.dropped += 1
                return
            self._write(msg, 0, retain, sub_ids, 0, now)
            return
        pending = self.pending
        if not pending and len(self.inflight) < self.receive_maximum:
            self._send_acked(msg, qos, retain, sub_ids, now, origin)
        elif pending is None:
            if self.max_queued:
                self.pending = deque([(msg, qos, retain, sub_ids, origin)])
            else:
                self.dropped += 1
        elif len(pending) < self.max_queued:
            pending.append((msg, qos, retain, sub_ids, origin))
        else:
            self.dropped += 1

    def _send_acked(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
        origin: object = None,
    ) -> None:
        pid = self._take_pid()
        if self._write(msg, qos, retain, sub_ids, pid, now):
            self.inflight[pid] = AWAIT_PUBACK if qos == 1 else AWAIT_PUBREC
            if origin is not None:
                if self.shared is None:
                    self.shared = {}
                self.shared[pid] = origin

    def unacked_shared(self) -> list[object]:
        """Origins of shared deliveries the client has not acknowledged (sent or queued)."""
        out = list(self.shared.values()) if self.shared else []
        if self.pending:
            out += [p[4] for p in self.pending if p[4] is not None]
        return out

    def _take_pid(self) -> int:
        pid = self._next_pid
        inflight = self.inflight
        while True:
            pid = pid + 1 if pid < 65535 else 1
            if pid not in inflight:
                self._next_pid = pid
                return pid

    def _write(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        pid: int,
        now: float,
        dup: bool = False,
    ) -> bool:
        topic = msg.topic
        level = self.level
        props_b = b""
        if level == 5:
            props = msg.properties
            alias = 0
            if self.alias_max:
                alias = self._alias.get(topic, 0)
                if alias:
                    topic = ""
                elif len(self._alias) < self.alias_max:
                    alias = len(self._alias) + 1
                    self._alias[topic] = alias
            if msg.expires_at is not None or sub_ids or alias:
                props = replace(
                    props,
                    message_expiry_interval=(
                        max(1, math.ceil(msg.expires_at - now))
                        if msg.expires_at is not None
                        else props.message_expiry_interval
                    ),
                    subscription_identifier=sub_ids,
                    topic_alias=alias or None,
                )
            props_b = b"\x00" if props is EMPTY else encode_properties(props)
        t = topic.encode()
        first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
        head = len(t).to_bytes(2, "big") + t
        if qos:
            head += pid.to_bytes(2, "big")
        n = len(head) + len(props_b) + len(msg.payload)
        if n < 128:
            data = bytes((first, n)) + head + props_b + msg.payload
        else:
            data = bytes((first,)) + encode_varint(n) + head + props_b + msg.payload
        if len(data) > self.max_packet_size:
            self.dropped += 1  # [MQTT-3.1.2-25] discard as if sent
            return False
        self.out += data
        self.sent += 1
        return True

    def acked(self, pid: int, stage: int, now: float) -> bool:
        """PUBACK (stage AWAIT_PUBACK) or PUBCOMP (AWAIT_PUBCOMP) for `pid`; True if known."""
        if self.inflight.get(pid) != stage:
            return False
        del self.inflight[pid]
        if self.track_completions:
            self.completed.append(pid)
        if self.shared:
            self.shared.pop(pid, None)
        self._pump(now)
        return True

    def received(self, pid: int, failed: bool, now: float) -> bool:
        """PUBREC for `pid`: answer PUBREL, or finish on an error reason (MQTT 5)."""
        if self.inflight.get(pid) != AWAIT_PUBREC:
            return False
        if self.shared:
            self.shared.pop(pid, None)  # the client has it: no redelivery after PUBREC
        if failed:
            del self.inflight[pid]
            if self.track_completions:
                self.completed.append(pid)
            self._pump(now)
            return True
        self.inflight[pid] = AWAIT_PUBCOMP
        if self.track_completions:
            self.released.append(pid)
        self.out += encode(PubRel(pid), self.level)
        return True

    def _pump(self, now: float) -> None:
        pending = self.pending
        if pending is None:
            return
        while pending and len(self.inflight) < self.receive_maximum:
            msg, qos, retain, sub_ids, origin = pending.popleft()
            if msg.expires_at is not None and msg.expires_at <= now:
                self.expired += 1
                continue
            self._send_acked(msg, qos, retain, sub_ids, now, origin)
