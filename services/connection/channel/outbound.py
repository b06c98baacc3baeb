"""Broker-to-client delivery for one connection, and the client's acks of it: inflight window,
bounded queue, topic aliases out, PUBACK/PUBREC/PUBCOMP.

Invariants:
- At most `receive_maximum` QoS 1/2 PUBLISHes are unacknowledged at once [MQTT-3.3.4-9];
  further ones wait in `pending`, which is bounded; what does not fit is dropped and counted.
- QoS 0 is never queued: it is written at once, or dropped when the transport is congested.
- Nothing is written while the transport is congested (its buffer is over its high-water
  mark): QoS 1/2 wait in `pending`, bounded in messages and bytes, so a client that stops
  reading costs the node at most the transport's buffer plus `max_queued_bytes`; a persistent
  session's deliveries stay in its durable queue meanwhile (the node reads no more).
- A PUBLISH larger than the client's maximum packet size is discarded as if sent
  [MQTT-3.1.2-25]; it establishes no topic alias, since the client never sees it.
- With an outbound bandwidth limit (`gate`, the tenant's and user's "bytes_out_per_s"
  budgets) every PUBLISH is charged as it is written. While the budget is spent QoS 0 is
  dropped and counted (`dropped_quota`); QoS 1/2 wait in `pending` (bounded as above) and a
  persistent session's window reads 0, so its entries stay in its queue; the gate's `wake`
  (the next lease) moves them on.
- `inflight` maps each unacknowledged packet id to the ack it waits for (AWAIT_*).
- A persistent session's PUBREL goes out only once its queue holds the entry as released
  (`send_pubrel`, called by persistence.py after the mark is durable): a client that got
  PUBREL forgets the message, so a later connection must find the entry released and resend
  PUBREL, never the PUBLISH. Until then the id waits in AWAIT_RELEASE.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from services.common.message import Message
from services.common.message_size import message_bytes
from services.common.mqtt.encoder import encode, frame_publish
from services.common.mqtt.packets import PubRel
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel.delivery_bytes import frame_v5, queued_size

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.budget import DeliveryGate

# inflight stage: the ack a delivery waits for
AWAIT_PUBACK: Final = 1
AWAIT_PUBREC: Final = 2
AWAIT_PUBCOMP: Final = 3
AWAIT_RELEASE: Final = 4  # PUBREC'd; PUBREL waits for the queue's durable released mark

# (message, qos, retain, subscription ids, origin); origin marks shared-subscription
# deliveries so they can be handed to another member if this client leaves unacked.
Pending = tuple[Message, int, bool, tuple[int, ...], object]


class Outbound:
    __slots__ = (
        "_alias",
        "_completed",
        "_next_pid",
        "_released",
        "_track",
        "alias_max",
        "bytes_out",
        "congested",
        "congested_since",
        "dropped",
        "dropped_queue_full",
        "dropped_quota",
        "dropped_too_large",
        "expired",
        "gate",
        "inflight",
        "level",
        "max_packet_size",
        "max_queued",
        "max_queued_bytes",
        "out",
        "pending",
        "pending_bytes",
        "receive_maximum",
        "sent",
        "sent_q1",
        "sent_q2",
        "shared",
    )

    def __init__(
        self,
        *,
        out: bytearray,
        level: int,
        receive_maximum: int,
        max_packet_size: int,
        alias_max: int,
        max_queued: int,
        max_queued_bytes: int = 1 << 62,
    ) -> None:
        self.out = out
        self.level = level
        self.receive_maximum = receive_maximum
        self.max_packet_size = max_packet_size
        self.alias_max = alias_max
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.pending_bytes = 0
        self.inflight: dict[int, int] = {}
        # Created on first use: an empty deque costs 760 bytes per idle connection.
        self.pending: deque[Pending] | None = None
        self._alias: dict[str, int] = {}
        self._next_pid = 0
        self.congested = False
        self.congested_since = 0.0
        # Counters (services/connection/stats.py reads them): PUBLISH packets written (and
        # those at QoS 1 and 2) and their bytes; drops, all causes and two of them (the
        # rest are QoS 0 dropped while congested); expired before sending.
        self.sent = 0
        self.sent_q1 = 0
        self.sent_q2 = 0
        self.bytes_out = 0
        self.dropped = 0
        self.dropped_queue_full = 0
        self.dropped_too_large = 0
        self.dropped_quota = 0
        self.expired = 0
        self.gate: DeliveryGate | None = None  # outbound bandwidth budgets (None: no quota)
        # Packet ids whose delivery finished (PUBACK/PUBCOMP, or PUBREC with an error), and
        # ids the client PUBREC'd, while `_track` (a persistent session reports them to its
        # queue): handed over by `take_progress`.
        self._completed: list[int] = []
        self._released: list[int] = []
        self._track = False
        # packet id -> origin of an unacknowledged shared-subscription delivery
        self.shared: dict[int, object] | None = None

    def limit(self, props: Properties, alias_cap: int = 65535) -> None:
        """Apply what an MQTT 5 CONNECT says the client accepts from us. Aliases: at most
        `alias_cap` of them, whatever the client allows (each holds a topic here)."""
        self.receive_maximum = props.receive_maximum or 65535
        self.max_packet_size = props.maximum_packet_size or (1 << 28)
        self.alias_max = min(props.topic_alias_maximum or 0, alias_cap)

    # ---- a persistent session's progress -------------------------------------------------

    def track_completions(self) -> None:
        """Record completions and releases for the session's queue from now on (only a
        persistent session reports to its queue; before anything is delivered)."""
        self._track = True

    def settled(self, pid: int) -> None:
        """A stored entry done without an ack to wait for (QoS 0, expired, too large): it is
        reported with the completions."""
        self._completed.append(pid)

    def take_progress(self) -> tuple[list[int], list[int]]:
        """The packet ids completed, and those the client PUBREC'd, since the last call
        (the caller owns both lists)."""
        done, released = self._completed, self._released
        if done:
            self._completed = []
        if released:
            self._released = []
        return done, released

    # ---- sending -------------------------------------------------------------------------

    def deliver(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
        origin: object = None,
    ) -> None:
        """A message for this client at its effective QoS: written, queued, or dropped."""
        if msg.expires_at is not None and msg.expires_at <= now:
            self.expired += 1
            return
        if qos == 0:
            if self.congested:
                self.dropped += 1
                return
            gate = self.gate
            if gate is not None and not gate.admit(msg, qos0=True):
                self.dropped += 1
                self.dropped_quota += 1
                gate.refused()
                return
            self._write(msg, 0, retain, sub_ids, 0, now)
            return
        pending = self.pending
        if (
            not pending
            and not self.congested
            and len(self.inflight) < self.receive_maximum
            and (self.gate is None or self.gate.admit(msg))
        ):
            self._send_acked(msg, qos, retain, sub_ids, now, origin)
            return
        size = queued_size(msg)
        if (
            (pending is not None and len(pending) >= self.max_queued)
            or not self.max_queued
            or self.pending_bytes + size > self.max_queued_bytes
        ):
            self.dropped += 1
            self.dropped_queue_full += 1
            return
        if pending is None:
            pending = self.pending = deque()
        pending.append((msg, qos, retain, sub_ids, origin))
        self.pending_bytes += size

    def set_congested(self, congested: bool, now: float) -> None:
        """The transport's buffer went over (True) or back under (False) its marks; when
        it drains, queued deliveries move into the window."""
        self.congested = congested
        if congested:
            self.congested_since = self.congested_since or now
        else:
            self.congested_since = 0.0
            self._pump(now)

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

    def send_pubrel(self, pid: int) -> None:
        """The queue holds `pid`'s entry as released (durably): PUBREL may go now."""
        if self.inflight.get(pid) == AWAIT_RELEASE:
            self.resend_pubrel(pid)

    @property
    def free_window(self) -> int:
        """Deliveries that may go into the window now: 0 while the bandwidth budget is spent
        (the gate then wakes the connection when tokens come)."""
        gate = self.gate
        if gate is not None and not gate.open():
            return 0
        return max(0, self.receive_maximum - len(self.inflight))

    def may_send(self, msg: Message) -> bool:
        """A stored entry may be written now (charged to the bandwidth budget if so)."""
        gate = self.gate
        return gate is None or gate.admit(msg)

    def resume(self, now: float) -> None:
        """The bandwidth budget has tokens again: move held deliveries into the window."""
        self._pump(now)

    def unacked_shared(self) -> list[object]:
        """Origins of shared deliveries the client has not acknowledged (sent or queued)."""
        out = list(self.shared.values()) if self.shared else []
        if self.pending:
            out += [p[4] for p in self.pending if p[4] is not None]
        return out

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
        """Frame and write one PUBLISH; False (and counted as dropped) if it is too large."""
        first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
        if self.level == 5:
            data, new_alias = frame_v5(msg, first, pid, sub_ids, now, self._alias, self.alias_max)
        else:
            data = frame_publish(first, msg.topic.encode(), pid, None, msg.payload)
            new_alias = 0
        if len(data) > self.max_packet_size:
            self.dropped += 1  # [MQTT-3.1.2-25] discard as if sent
            self.dropped_too_large += 1
            return False
        if new_alias:
            self._alias[msg.topic] = new_alias
        self.out += data
        self.sent += 1
        self.bytes_out += message_bytes(msg.topic, msg.payload)  # the billed size
        if qos:
            if qos == 1:
                self.sent_q1 += 1
            else:
                self.sent_q2 += 1
        return True

    # ---- the client's acks ---------------------------------------------------------------

    def on_puback(self, pid: int, now: float) -> bool:
        """PUBACK of a QoS 1 delivery; True if a completion was recorded for the queue."""
        return self._finish(pid, AWAIT_PUBACK, now)

    def on_pubcomp(self, pid: int, now: float) -> bool:
        """PUBCOMP of a QoS 2 delivery; True if a completion was recorded for the queue."""
        return self._finish(pid, AWAIT_PUBCOMP, now)

    def on_pubrec(self, pid: int, reason_code: int, now: float) -> bool:
        """PUBREC of a QoS 2 delivery: answer PUBREL, or finish on an error reason (MQTT 5).
        True if a release or completion was recorded for the queue (a persistent session's
        PUBREL then waits for `send_pubrel`)."""
        stage = self.inflight.get(pid)
        if stage != AWAIT_PUBREC:
            if stage != AWAIT_RELEASE:  # a repeated PUBREC while the mark is written: ignored
                self.out += encode(PubRel(pid, RC.PACKET_IDENTIFIER_NOT_FOUND), self.level)
            return False
        # The client has it: no redelivery of a shared delivery after PUBREC.
        shared = self.shared.pop(pid, None) if self.shared else None
        if reason_code >= 0x80:
            return self._finish(pid, AWAIT_PUBREC, now)
        if self._track and shared is None:
            # A queue entry: its released mark is stored before the PUBREL. A shared delivery
            # is no entry of the session's queue (nothing to mark): PUBREL at once.
            self.inflight[pid] = AWAIT_RELEASE
            self._released.append(pid)
            return True
        self.inflight[pid] = AWAIT_PUBCOMP
        self.out += encode(PubRel(pid), self.level)
        return False

    def _finish(self, pid: int, stage: int, now: float) -> bool:
        if self.inflight.get(pid) != stage:
            return False  # unknown or at another stage: nothing to do
        del self.inflight[pid]
        if self.shared:
            self.shared.pop(pid, None)
        recorded = self._track
        if recorded:
            self._completed.append(pid)
        self._pump(now)
        return recorded

    def _pump(self, now: float) -> None:
        """Move queued deliveries into the window the last ack freed."""
        pending = self.pending
        if pending is None:
            return
        gate = self.gate
        while pending and not self.congested and len(self.inflight) < self.receive_maximum:
            msg = pending[0][0]
            if msg.expires_at is not None and msg.expires_at <= now:
                pending.popleft()
                self.pending_bytes -= queued_size(msg)
                self.expired += 1
                continue
            if gate is not None and not gate.admit(msg):
                return  # held until the gate wakes the connection
            msg, qos, retain, sub_ids, origin = pending.popleft()
            self.pending_bytes -= queued_size(msg)
            self._send_acked(msg, qos, retain, sub_ids, now, origin)
