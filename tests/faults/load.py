"""Load for the fault suite: paho publishers and subscribers that keep going through faults.

Each client reconnects on its own (paho's loop, 0.1-0.5 s backoff) and, when its connection
is lost or refused, tries the next node of the mesh, so a client of a dead node resumes on
another one; told DISCONNECT 0x9C (Use another server) with a Server Reference (a node
draining), it goes to the first server the reference names, as an MQTT 5 client should.
Every DISCONNECT a client got from the server is kept (`server_disconnects`: reason code
and Server Reference), for tests that say which ones a client must never see.
Publishers send `payload(name, seq)` at a steady rate to `<base>/<name>` and
record, through the `Checker`, every publish and every PUBACK/PUBCOMP; subscribers take
`<base>/#` at QoS 2 (so each message arrives at its publish QoS) unless told otherwise, and
record every PUBLISH with the QoS it came at.
A persistent subscriber is an MQTT 5 session with a 10-minute expiry; paho keeps its QoS 2
receive state across reconnects and hands a message over once, on PUBREL.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    MqttError,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from services.common.mqtt import Properties as MqttProperties
from tests.e2e.clients import Raw
from tests.faults.checker import Checker, payload

Ports = Callable[[], list[int]]  # the nodes' MQTT ports, read again at each reconnect


def referred_node(reference: str, ports: list[int]) -> int | None:
    """The node a Server Reference names first (`host:port host:port ...`, docs/operations.md),
    as an index into `ports`; None when it names no node of the mesh."""
    first = reference.split()[0] if reference.strip() else ""
    try:
        return ports.index(int(first.rsplit(":", 1)[1]))
    except (IndexError, ValueError):
        return None


class _Client:
    """A paho client that moves to the next node whenever its connection is lost."""

    def __init__(self, name: str, ports: Ports, node: int, persistent: bool) -> None:
        self.name = name
        self._ports = ports
        self._node = node
        self.connects = 0
        self.disconnects = 0
        self.server_disconnects: list[tuple[int, str]] = []  # (reason code, Server Reference)
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
        # Paho's `port` setter refuses while a connection is being opened, which is the
        # state its reconnect loop is in when these callbacks run; its next attempt reads
        # `_port`.
        self.c._port = ports[self._node]

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
        reference = ""
        if f.is_disconnect_packet_from_server:
            reference = str(getattr(p, "ServerReference", "") or "")
            self.server_disconnects.append((int(rc.value), reference))
        ports = self._ports()
        node = referred_node(reference, ports)
        if node is None:
            self._next_node()
        else:
            self._node = node
            self.c._port = ports[node]  # see _next_node

    def _on_connect_fail(self, c: Any, u: Any) -> None:
        self._next_node()

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def drop(self) -> None:
        """Lose the connection (no DISCONNECT): paho sees the socket end and reconnects, to
        the next node."""
        sock = self.c.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


class Publisher:
    """Publishes `payload(name, seq)` at `rate` per second over a raw MQTT 5 socket.

    Not paho: after a reconnect paho can send a new PUBLISH before it resends the ones in
    flight (a publish call between its CONNECT and its CONNACK handling), which reorders
    the publisher's own stream. This client resends strictly in order, then continues.
    QoS 1 uses a clean session; QoS 2 a persistent one, so that after a reconnect an
    exchange that got PUBREC is finished with PUBREL, not a second PUBLISH.
    """

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
        window: int = 50,
    ) -> None:
        self.name = name
        self._ports = ports
        self._node = node
        self.qos = qos
        self.topic = topic
        self.checker = checker
        self.rate = rate
        self.size = size
        self.window = window
        self.client_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.connects = 0
        self.refused = 0  # PUBACK/PUBREC/PUBCOMP with a failure reason code: not acknowledged
        # Each of those: (packet type, reason code, seq).
        self.refusals: list[tuple[str, int, int]] = []
        self.server_disconnects: list[tuple[int, str]] = []  # (reason code, Server Reference)
        self._referred: int | None = None  # the node a DISCONNECT's Server Reference named
        self.followed = 0  # reconnections to the node a Server Reference named
        self.sessions_lost = 0  # CONNACKs without the QoS 2 publisher's session
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._backlog: deque[tuple[int, int]] = deque()  # (seq, size) not yet sent
        self._inflight: OrderedDict[int, list[int]] = OrderedDict()  # pid -> [seq, size, rel]
        self._next_pid = 0
        self.seq = 0
        self._generating = threading.Event()
        self._closing = threading.Event()
        self._raw: Raw | None = None
        self._threads = [
            threading.Thread(target=self._generate, daemon=True),
            threading.Thread(target=self._run, daemon=True),
        ]
        checker.publisher(name, qos)

    def start(self) -> None:
        if self.rate:  # 0: publishes only through enqueue()
            self._generating.set()
            self._threads[0].start()
        self._threads[1].start()
        assert self.connected.wait(10), f"{self.name} not connected"

    def drop(self) -> None:
        """Lose the connection (no DISCONNECT), as a network failure does; the client
        reconnects to the next node."""
        raw = self._raw
        if raw is not None:
            raw.sock.shutdown(socket.SHUT_RDWR)

    def enqueue(self, size: int | None = None) -> None:
        """One more publish (of `size` bytes, default the publisher's)."""
        with self._lock:
            seq = self.seq
            self.seq += 1
            self._backlog.append((seq, size or self.size))
        self.checker.sent(self.name, seq)

    def _generate(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while self._generating.is_set():
            self.enqueue()
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def pause(self) -> None:
        """No new publishes; what is queued or in flight still goes out."""
        self._generating.clear()
        if self._threads[0].is_alive():
            self._threads[0].join(5)

    def unacked(self) -> int:
        with self._lock:
            return len(self._backlog) + len(self._inflight)

    def stop(self) -> None:
        self._generating.clear()
        self._closing.set()
        for t in self._threads:
            if t.is_alive():
                t.join(10)

    # ---- the connection -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._closing.is_set():
            ports = self._ports()
            port = ports[self._node % len(ports)]
            try:
                self._connection(port)
            except (OSError, ConnectionError, TimeoutError, MqttError):
                pass
            self.connected.clear()
            if self._referred is not None:  # sent elsewhere (0x9C): go where it says
                self._node, self._referred = self._referred, None
                self.followed += 1
            else:
                self._node += 1  # lost or refused: try the next node
            time.sleep(0.1)

    def _connection(self, port: int) -> None:
        raw = self._raw = Raw(port)
        try:
            props = MqttProperties(session_expiry_interval=600 if self.qos == 2 else 0)
            ack = raw.connect(
                Connect(
                    self.client_id, 5, clean_start=self.qos != 2, keepalive_s=30, properties=props
                )
            )
            if not isinstance(ack, ConnAck) or ack.reason_code != 0:
                return
            self.connects += 1
            with self._lock:
                if self.qos == 2 and not ack.session_present and self.connects > 1:
                    self.sessions_lost += 1
                # Resend what is in flight, in order, before anything new [MQTT-4.6.0-1]:
                # PUBREL where the server had sent PUBREC (it kept that state with the
                # session), the PUBLISH again (DUP) otherwise.
                for pid, (seq, size, rel) in self._inflight.items():
                    if rel and ack.session_present:
                        raw.send(PubRel(pid))
                    else:
                        self._inflight[pid][2] = 0
                        raw.send(self._publish(pid, seq, size, dup=True))
            self.connected.set()
            last_ping = time.monotonic()
            while not self._closing.is_set():
                self._send_new(raw)
                try:
                    packet = raw.recv(timeout=0.02)
                except TimeoutError:
                    if time.monotonic() - last_ping > 10:
                        raw.send(PingReq())
                        last_ping = time.monotonic()
                    continue
                self._handle(raw, packet)
        finally:
            self._raw = None
            raw.close()

    def _publish(self, pid: int, seq: int, size: int, dup: bool = False) -> Publish:
        return Publish(self.topic, payload(self.name, seq, size), self.qos, dup=dup, packet_id=pid)

    def _send_new(self, raw: Raw) -> None:
        while True:
            with self._lock:
                if not self._backlog or len(self._inflight) >= self.window:
                    return
                seq, size = self._backlog.popleft()
                pid = self._next_pid % 65535 + 1
                while pid in self._inflight:
                    pid = pid % 65535 + 1
                self._next_pid = pid
                self._inflight[pid] = [seq, size, 0]
            raw.send(self._publish(pid, seq, size))

    def _handle(self, raw: Raw, packet: Packet) -> None:
        if isinstance(packet, Disconnect):
            reference = packet.properties.server_reference or ""
            self.server_disconnects.append((packet.reason_code, reference))
            self._referred = referred_node(reference, self._ports())
            raise ConnectionError(f"DISCONNECT {packet.reason_code:#x}")
        if isinstance(packet, PubAck | PubComp):
            self._done(packet.packet_id, packet.reason_code, type(packet).__name__)
        elif isinstance(packet, PubRec):
            if packet.reason_code >= 0x80:
                self._done(packet.packet_id, packet.reason_code, "PubRec")
                return
            with self._lock:
                entry = self._inflight.get(packet.packet_id)
                if entry is not None:
                    entry[2] = 1
            raw.send(PubRel(packet.packet_id))

    def _done(self, pid: int, reason_code: int, kind: str) -> None:
        with self._lock:
            entry = self._inflight.pop(pid, None)
        if entry is None:
            return
        if reason_code >= 0x80:
            self.refused += 1
            self.refusals.append((kind, reason_code, entry[0]))
        else:
            self.checker.acked(self.name, entry[0])


class Subscriber(_Client):
    def __init__(
        self,
        name: str,
        ports: Ports,
        node: int,
        persistent: bool,
        topic: str,
        checker: Checker,
        qos: int = 2,
    ) -> None:
        super().__init__(name, ports, node, persistent)
        self.topic = topic
        self.qos = qos
        self.checker = checker
        self.subscribed = threading.Event()
        self.c.on_message = lambda c, u, m: checker.delivered(name, m.payload, m.qos)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        checker.subscriber(name, persistent)

    def on_connected(self, session_present: bool) -> None:
        if not session_present:  # a clean session, or a persistent one's first connection
            self.c.subscribe(self.topic, self.qos)

    def start(self) -> None:
        super().start()
        assert self.subscribed.wait(10), f"{self.name} not subscribed"
