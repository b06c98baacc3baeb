"""Test clients: a paho-mqtt wrapper with blocking waits, and a raw-socket MQTT client built
on the project's codec (for malformed input and exact packet checks).
"""

from __future__ import annotations

import queue
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from paho.mqtt.subscribeoptions import SubscribeOptions

from services.common.mqtt import Connect, Decoder, Disconnect, MqttError, Packet, Publish, encode
from tests.poll import wait_until

TIMEOUT = 10.0


class Paho:
    def __init__(
        self,
        port: int,
        client_id: str | None = None,
        v5: bool = True,
        username: str | None = None,
        password: str | None = None,
        clean: bool = True,
        transport: str = "tcp",
        tls_ca: str | None = None,
        will: tuple[str, bytes, int] | None = None,
        keepalive: int = 30,
    ) -> None:
        self.client_id = client_id or f"t-{uuid.uuid4().hex[:10]}"
        self.v5 = v5
        self.port = port
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            transport=transport,  # type: ignore[arg-type]
            **({} if v5 else {"clean_session": clean}),
        )
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        if tls_ca:
            self.c.tls_set(ca_certs=tls_ca, cert_reqs=ssl.CERT_REQUIRED)
        if username is not None:
            self.c.username_pw_set(username, password)
        if will is not None:
            self.c.will_set(will[0], will[1], will[2])
        self.keepalive = keepalive
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[Any] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.pubacks: dict[int, Any] = {}
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.session_present: bool | None = None

        def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
            self.session_present = bool(flags.session_present)
            self.connacks.put(rc)

        self.c.on_connect = on_connect
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.put(rcs)
        self.c.on_disconnect = lambda c, u, f, rc, p: self.disconnects.put(rc)
        self.c.on_publish = lambda c, u, mid, rc, p: self.pubacks.__setitem__(mid, rc)

    def connect(
        self,
        expect_ok: bool = True,
        clean_start: bool = True,
        session_expiry: int | None = None,
        source_port: int = 0,
    ) -> Any:
        """`source_port`: connect from this local port (0: any)."""
        kwargs: dict[str, Any] = {"keepalive": self.keepalive, "bind_port": source_port}
        if self.v5:
            kwargs["clean_start"] = clean_start
            if session_expiry is not None:
                props = PahoProps(PacketTypes.CONNECT)
                props.SessionExpiryInterval = session_expiry
                kwargs["properties"] = props
        self.c.connect("127.0.0.1", self.port, **kwargs)
        self.c.loop_start()
        rc = self.connacks.get(timeout=TIMEOUT)
        if expect_ok:
            assert not rc.is_failure, f"CONNACK {rc}"
        return rc

    def subscribe(
        self, topic: str, qos: int = 0, sub_id: int | None = None, **options: bool
    ) -> list[Any]:
        props = None
        if sub_id is not None:
            props = PahoProps(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        if self.v5:
            self.c.subscribe(topic, options=SubscribeOptions(qos=qos, **options), properties=props)
        else:
            self.c.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        qos: int = 0,
        retain: bool = False,
        props: PahoProps | None = None,
    ) -> Any:
        info = self.c.publish(topic, payload, qos, retain, properties=props)
        info.wait_for_publish(TIMEOUT)
        return self.pubacks.get(info.mid)

    def expect(self, n: int = 1, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        """The next `n` messages, each within `timeout`; AssertionError naming what did come
        (and any disconnects) when one does not."""
        got: list[mqtt.MQTTMessage] = []
        for _ in range(n):
            try:
                got.append(self.messages.get(timeout=timeout))
            except queue.Empty:
                came = [(m.topic, m.payload[:40]) for m in got]
                raise AssertionError(
                    f"{len(got)} of {n} messages within {timeout} s each: {came}; "
                    f"disconnects: {list(self.disconnects.queue)}"
                ) from None
        return got

    def nothing(self, wait_s: float = 0.4) -> None:
        try:
            m = self.messages.get(timeout=wait_s)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {m.topic}: {m.payload!r}")

    def close(self, session_expiry: int | None = None) -> None:
        """DISCONNECT (with a Session Expiry Interval, MQTT 5), then stop the loop."""
        props = None
        if session_expiry is not None:
            props = PahoProps(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = session_expiry
        self.c.disconnect(properties=props)
        self.c.loop_stop()


class Raw:
    """A blocking MQTT client over a plain socket, speaking through the project's codec."""

    def __init__(self, port: int, level: int = 5, source_port: int = 0) -> None:
        """`source_port`: connect from this local port (0: any)."""
        source = ("127.0.0.1", source_port) if source_port else None
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=TIMEOUT, source_address=source
        )
        self.level = level
        self.decoder = Decoder(level)
        self.pending: list[Packet] = []

    def send(self, packet: Packet | bytes) -> None:
        self.sock.sendall(packet if isinstance(packet, bytes) else encode(packet, self.level))

    def connect(self, connect: Connect) -> Packet:
        self.level = connect.protocol_level
        self.decoder.protocol_level = self.level
        self.send(connect)
        return self.recv()

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by server")
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def closed(self, timeout: float = TIMEOUT) -> bool:
        """True once the server closed the socket (packets before the close are kept)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not data:
                return True
            try:
                self.pending += self.decoder.feed(data)
            except MqttError:
                return False
        return False

    def close(self) -> None:
        self.sock.close()


READ_BYTES = 4096  # what a Flooder reads between two writes, at most


class Flooder(threading.Thread):
    """A client busy writing: QoS 0 PUBLISHes flat out on an open connection, looking for
    input only between two writes, as a client whose loop writes before it reads. It stops
    at the server's DISCONNECT (then closes, as a client does), at end of input, or at an
    error (a reset: what it had not read is lost to it), and records which.

    `send` writes bytes (blocking); `poll` returns what arrived (b"": end of input, None:
    nothing yet); `close` closes the connection."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        poll: Callable[[], bytes | None],
        close: Callable[[], None],
        level: int = 5,
        topic: str = "flood/x",
    ) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self._send, self._poll, self._close = send, poll, close
        self.level = level
        self.sent_bytes = 0
        self.received = 0  # PUBLISHes the server sent
        self.disconnect: Disconnect | None = None
        self.ended = ""  # "disconnect", "eof" or the error
        self.done = threading.Event()
        self._injected = b""

    @classmethod
    def over(cls, raw: Raw, topic: str = "flood/x") -> Flooder:
        """On a connected `Raw` client (plain TCP or TLS)."""
        sock = raw.sock

        def poll() -> bytes | None:
            pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
            if not pending and not select.select([sock], [], [], 0)[0]:
                return None
            try:
                return sock.recv(READ_BYTES)
            except ssl.SSLWantReadError:  # a TLS record not complete yet
                return None

        sock.settimeout(TIMEOUT)
        return cls(sock.sendall, poll, raw.close, raw.level, topic)

    def run(self) -> None:
        batch = encode(Publish(self.topic, b"x" * 200, 0), self.level) * 32
        decoder = Decoder(self.level)
        try:
            while True:
                injected, self._injected = self._injected, b""
                self._send(injected + batch if injected else batch)
                self.sent_bytes += len(batch)
                data = self._poll()
                if data is None:
                    continue
                if not data:
                    self.ended = "eof"
                    return
                for p in decoder.feed(data):
                    if isinstance(p, Disconnect):
                        self.disconnect, self.ended = p, "disconnect"
                        return
                    self.received += 1
        except Exception as exc:  # a reset, a broken pipe, a closed WebSocket
            self.ended = f"{type(exc).__name__}: {exc}"
        finally:
            self._close()
            self.done.set()

    def inject(self, data: bytes) -> None:
        """Send `data` before the next batch (then flood on)."""
        self._injected = data

    def flooding(self, nbytes: int = 256 << 10) -> None:
        """Wait until `nbytes` went out (the server has unread input from now on)."""
        wait_until(
            lambda: self.sent_bytes >= nbytes or self.done.is_set(),
            TIMEOUT,
            "the flood started",
            every_s=0.01,
        )
        assert not self.done.is_set(), self.ended
