"""The PUBACKs and PUBRECs a publisher is owed, released in the order its PUBLISHes came
(channel/inbound.py owes them; the node says when each one's publish is routed)."""

from __future__ import annotations


class OwedAck:
    """One PUBACK (QoS 1) or PUBREC (QoS 2) the publisher is owed."""

    __slots__ = ("packet_id", "qos", "ready", "reason_code", "text")

    def __init__(self, packet_id: int, qos: int, reason_code: int, ready: bool, text: str) -> None:
        self.packet_id = packet_id
        self.qos = qos
        self.reason_code = reason_code
        self.ready = ready  # False while the node has not finished routing the message
        self.text = text  # the Reason String of a refusal ("": the code's generic text)


class PublisherAcks:
    """Acks owed to the publisher, released in the order its PUBLISHes came [MQTT-4.6.0-2].

    Invariant: the first waiting ack, if any, is not ready; everything ready before it has
    been released. So an ack that is ready while nothing waits goes out at once, without
    being stored: the common case (acks not deferred) allocates nothing.
    A list, not a deque: it is short, and an empty deque costs 760 bytes per connection.
    """

    __slots__ = ("_waiting", "qos1_waiting")

    def __init__(self) -> None:
        self._waiting: list[OwedAck] = []
        self.qos1_waiting = 0  # PUBACKs among `_waiting`: unacknowledged QoS 1 publishes

    @property
    def waiting(self) -> bool:
        """Some ack waits for the node (it finishes routing the publish)."""
        return bool(self._waiting)

    def owes(self, packet_id: int) -> bool:
        """An ack for `packet_id` has not been released yet."""
        return any(a.packet_id == packet_id for a in self._waiting)

    def add(self, packet_id: int, qos: int, reason_code: int, ready: bool, text: str = "") -> bool:
        """Owe an ack; True if it may be sent now (it is ready and nothing waits before it)."""
        if ready and not self._waiting:
            return True
        self._waiting.append(OwedAck(packet_id, qos, reason_code, ready, text))
        if qos == 1:
            self.qos1_waiting += 1
        return False

    def settle(self, packet_id: int, reason_code: int) -> list[OwedAck]:
        """The first waiting ack for `packet_id` is ready with `reason_code`; returns the acks
        that may go now, in order (none while an earlier one still waits)."""
        waiting = self._waiting
        for a in waiting:
            if a.packet_id == packet_id and not a.ready:
                a.reason_code, a.ready = reason_code, True
                break
        n = q1 = 0
        for a in waiting:
            if not a.ready:
                break
            n += 1
            q1 += a.qos == 1
        released = waiting[:n]
        del waiting[:n]
        self.qos1_waiting -= q1
        return released
