"""Load for the fault suite: paho publishers and subscribers that keep going through faults.

Each client reconnects on its own (paho's loop, 0.1-0.5 s backoff) and, when its connection
is lost or refused, tries the next node of the mesh, so a client of a dead node resumes on
another one. Publishers send `payload(name, seq)` at a steady rate to `<base>/<name>` and
record, through the `Checker`, every publish and every PUBACK/PUBCOMP; subscribers take
`<base>/#` at QoS 2 (so each message arrives at its publish QoS) and record every PUBLISH.
A persistent subscriber is an MQTT 5 session with a 10-minute expiry; paho keeps its QoS 2
receive state across reconnects and hands a message over once, on PUBREL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.faults.checker import Checker, payload

Ports = Callable[[], list[int]]  # the nodes' MQTT ports, read again at each reconnect


class _Client:
    """A paho client that moves to the next node whenever its connection is lost."""

    def __init__(self, name: str, ports: Ports, node: int, persistent: bool) -> None:
        self.name = name
        self._ports = ports
        self._node = node
        self.connects = 0
        self.disconnects = 0
        self.connected = threading.Event()
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"{name}-{uuid.uuid4().hex[:6]}",
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=True,
        )
        self.c.reconnect_delay_set(min_delay=0.1, max_delay=0.5)  # type: ignore[arg-type]
        self.c.max_inflight_messages_set(50)
        self.c.max_queued_messages_set(0)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_connect_fail = self._on_connect_fail
        self._props: Properties | None = None
        if persistent:
            self._props = Properties(PacketTypes.CONNECT)
            self._props.SessionExpiryInterval = 600
        self.persistent = persistent

    def start(self) -> None:
        self.c.connect_async(
            "127.0.0.1",
            self._ports()[self._node],
            keepalive=10,
            clean_start=not self.persistent,
            properties=self._props,
        )
        self.c.loop_start()

    def _next_node(self) -> None:
        ports = self._ports()
        self._node = (self._node + 1) % len(ports)
        try:
            self.c.port = ports[self._node]
        except RuntimeError:
            pass  # still open: paho closes it before its next attempt; the next failure moves

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        if rc.is_failure:  # refused (say, the session is still held by a dead node)
            return
        self.connects += 1
        self.connected.set()
        self.on_connected(bool(flags.session_present))

    def on_connected(self, session_present: bool) -> None:
        pass

    def _on_disconnect(self, c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
        self.disconnects += 1
        self.connected.clear()
        self._next_node()

    def _on_connect_fail(self, c: Any, u: Any) -> None:
        self._next_node()

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class Publisher(_Client):
    """Publishes `payload(name, seq)` at `rate` per second (QoS 1: a clean session; QoS 2: a
    persistent one, so an unfinished exchange is completed after a reconnect)."""

    def __init__(
        self,
        name: str,
        ports: Ports,
        node: int,
        qos: int,
        topic: str,
        checker: Checker,
        rate: float = 150.0,
        size: int = 0,
    ) -> None:
        super().__init__(name, ports, node, persistent=qos == 2)
        self.qos = qos
        self.topic = topic
        self.checker = checker
        self.rate = rate
        self.size = size
        self.seq = 0
        self._mids: dict[int, int] = {}  # paho's message id -> seq, until acknowledged
        self._early: dict[int, bool] = {}  # acknowledged before publish() returned its mid
        self._mids_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.c.on_publish = self._on_publish
        checker.publisher(name, qos)

    def start(self) -> None:
        super().start()
        self.connected.wait(10)
        self._thread.start()

    def _on_publish(self, c: Any, u: Any, mid: int, rc: Any, p: Any) -> None:
        # Paho calls this on PUBACK (QoS 1) and PUBCOMP (QoS 2): acknowledged.
        with self._mids_lock:
            seq = self._mids.pop(mid, None)
            if seq is None:  # before publish_one saw its mid
                self._early[mid] = not rc.is_failure
                return
        if not rc.is_failure:
            self.checker.acked(self.name, seq)

    def publish_one(self, size: int | None = None) -> None:
        seq = self.seq
        self.seq += 1
        self.checker.sent(self.name, seq)
        # Not under _mids_lock: paho calls on_publish holding its own lock, which publish()
        # takes too.
        info = self.c.publish(self.topic, payload(self.name, seq, size or self.size), self.qos)
        with self._mids_lock:
            ok = self._early.pop(info.mid, None)
            if ok is None:
                self._mids[info.mid] = seq
                return
        if ok:
            self.checker.acked(self.name, seq)

    def _run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.publish_one()
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)

    def pause(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def unacked(self) -> int:
        with self._mids_lock:
            return len(self._mids)


class Subscriber(_Client):
    def __init__(
        self, name: str, ports: Ports, node: int, persistent: bool, topic: str, checker: Checker
    ) -> None:
        super().__init__(name, ports, node, persistent)
        self.topic = topic
        self.checker = checker
        self.subscribed = threading.Event()
        self.c.on_message = lambda c, u, m: checker.delivered(name, m.payload)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        checker.subscriber(name, persistent)

    def on_connected(self, session_present: bool) -> None:
        if not session_present:  # a clean session, or a persistent one's first connection
            self.c.subscribe(self.topic, 2)

    def start(self) -> None:
        super().start()
        assert self.subscribed.wait(10), f"{self.name} not subscribed"
