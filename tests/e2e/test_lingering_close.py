"""A client busy writing still reads why the node closed it (services/connection/linger.py).

Each client floods QoS 0 PUBLISHes and looks for input only between two writes. Closing a
socket with unread input resets it, and such a client then fails on its next write without
reading its DISCONNECT; the node's lingering close (half-close, input dropped until the client
closes) lets it read the reason code instead. Over TCP, TLS and WebSocket, for a takeover
(0x8E) and a protocol error (0x90); the drain (0x9C) is in test_drain.py. A WebSocket's close
frame comes after the MQTT DISCONNECT.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable

import pytest
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.sync.client import connect as ws_connect

from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from services.common.mqtt.reason import ReasonCode as RC
from tests.conftest import MeshInfo
from tests.e2e.clients import READ_BYTES, TIMEOUT, Flooder, Raw

TRANSPORTS = ["tcp", "tls", "ws"]


def _flooder(mesh: MeshInfo, transport: str, client_id: str) -> Flooder:
    """A connected MQTT 5 client of connection-0 over `transport`, ready to flood a topic it
    is subscribed to: it gets as much as it writes, and reads less than it gets."""
    node = mesh.mesh.by_name("connection-0")
    topic = f"flood/{client_id}"
    connect = encode(Connect(client_id, 5), 5)
    subscribe = encode(Subscribe(1, (Subscription(topic, 0),)), 5)
    if transport == "ws":
        url = f"ws://127.0.0.1:{node.ws_port}/mqtt"
        # Entered by hand: the flooder's thread closes it.
        ws = ws_connect(url, subprotocols=["mqtt"]).__enter__()  # type: ignore[list-item]
        ws.send(connect)
        [ack] = Decoder(5).feed(ws.recv(timeout=TIMEOUT))  # type: ignore[arg-type]
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        ws.send(subscribe)
        [suback] = Decoder(5).feed(ws.recv(timeout=TIMEOUT))  # type: ignore[arg-type]
        assert isinstance(suback, SubAck), suback

        def send(data: bytes) -> None:
            try:
                ws.send(data)
            except ConnectionClosedOK:
                pass  # closed cleanly: what came before it is still read (poll)

        def poll() -> bytes | None:
            data = bytearray()
            try:
                while len(data) < READ_BYTES:
                    frame = ws.recv(timeout=0)
                    assert isinstance(frame, bytes)
                    data += frame
            except TimeoutError:
                pass
            except ConnectionClosedOK:
                if not data:
                    return b""
            return bytes(data) or None

        return Flooder(send, poll, ws.close, topic=topic)
    raw = Raw(node.tls_port if transport == "tls" else node.port)
    if transport == "tls":
        ctx = ssl.create_default_context(cafile=str(mesh.cert))
        raw.sock = ctx.wrap_socket(raw.sock, server_hostname="localhost")
    ack = raw.connect(Connect(client_id, 5))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    raw.send(subscribe)
    assert isinstance(raw.recv(), SubAck)
    return Flooder.over(raw, topic)


def _told(flooder: Flooder, cause: Callable[[], None], reason: int) -> None:
    flooder.start()
    flooder.flooding()  # the node has unread input from now on
    cause()
    assert flooder.done.wait(TIMEOUT), "still flooding: the node did not close"
    assert flooder.ended == "disconnect", f"no DISCONNECT read: {flooder.ended}"
    bye = flooder.disconnect
    assert bye is not None and bye.reason_code == reason, bye


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_client_busy_writing_reads_its_takeover(mesh: MeshInfo, transport: str) -> None:
    client_id = f"flood-{transport}-{uuid.uuid4().hex[:8]}"
    flooder = _flooder(mesh, transport, client_id)
    newer = Raw(mesh.node(1))

    def take_over() -> None:
        ack = newer.connect(Connect(client_id, 5))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack

    _told(flooder, take_over, RC.SESSION_TAKEN_OVER)
    newer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_client_busy_writing_reads_its_protocol_error(mesh: MeshInfo, transport: str) -> None:
    flooder = _flooder(mesh, transport, f"flood-bad-{transport}-{uuid.uuid4().hex[:8]}")
    # A wildcard in a PUBLISH topic [MQTT-3.3.2-2], then the flood goes on.
    bad = encode(Publish("flood/+", b"x", 0), 5)
    _told(flooder, lambda: flooder.inject(bad), RC.TOPIC_NAME_INVALID)


def test_a_websocket_text_frame_gets_disconnect_0x81_then_the_close_frame(
    mesh: MeshInfo,
) -> None:
    """MQTT over WebSocket is binary frames only [MQTT-6.0.0-1]."""
    port = mesh.mesh.by_name("connection-1").ws_port
    with ws_connect(f"ws://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"]) as ws:  # type: ignore[list-item]
        ws.send(encode(Connect(f"text-{uuid.uuid4().hex[:8]}", 5), 5))
        [ack] = Decoder(5).feed(ws.recv(timeout=TIMEOUT))  # type: ignore[arg-type]
        assert isinstance(ack, ConnAck)
        ws.send("not binary")
        [bye] = Decoder(5).feed(ws.recv(timeout=TIMEOUT))  # type: ignore[arg-type]
        assert isinstance(bye, Disconnect) and bye.reason_code == RC.MALFORMED_PACKET
        # The close frame, after the DISCONNECT: 1003, a kind of data the server refuses.
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=TIMEOUT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003
