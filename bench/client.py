"""The load generator's MQTT 3.1.1 client: a raw asyncio protocol that counts deliveries and
PUBACKs, acknowledges QoS 1 deliveries, records latencies from a payload's send timestamp,
and wakes a waiting publisher (bench/publishers.py) once its marks are reached.

`connect` opens one; bench/loadgen.py drives many."""

from __future__ import annotations

import asyncio
import struct
import time

from bench.frames import split_frames
from services.common.mqtt import ConnAck, Connect, Subscribe, Subscription, encode


class Client(asyncio.Protocol):
    """An MQTT 3.1.1 client that counts deliveries, acknowledges QoS 1 ones and PUBACKs."""

    def __init__(self, name: str, on_publish: object = None, clean: bool = True) -> None:
        self.name = name
        self.clean = clean
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[ConnAck] = asyncio.get_running_loop().create_future()
        self.suback: asyncio.Future[None] | None = None
        self.received = 0
        self.acks = 0
        self.latencies: list[float] = []
        self.record = False
        self.ack_event = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.qos1 = False
        # Set once `received` and `acks` reach the wake_* marks (a waiting publisher's refill
        # point), not on every packet: a wake-up per delivery would make the generator, not
        # the broker, the bottleneck. Closed loop: shared by a publisher and its subscriber.
        self.wake: asyncio.Event | None = None
        self.wake_rx = 0
        self.wake_acks = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(encode(Connect(self.name, 4, clean_start=self.clean, keepalive_s=120), 4))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        frames, used = split_frames(buf)
        acks = bytearray()
        for first, start, _end in frames:
            kind = first >> 4
            if kind == 3:  # PUBLISH
                self.received += 1
                qos = (first >> 1) & 3
                if qos or self.record:
                    at = start + 2 + (buf[start] << 8 | buf[start + 1])  # past the topic
                    if qos:
                        acks += b"\x40\x02" + buf[at : at + 2]  # PUBACK (QoS 1 only here)
                        at += 2
                    if self.record:
                        sent_at = struct.unpack_from("d", buf, at)[0]
                        self.latencies.append(time.perf_counter() - sent_at)
            elif kind == 4:  # PUBACK
                self.acks += 1
                self.ack_event.set()
            elif kind == 2:  # CONNACK: flags, return code
                if not self.connack.done():
                    self.connack.set_result(ConnAck(bool(buf[start] & 1), buf[start + 1]))
            elif kind == 9 and self.suback is not None and not self.suback.done():
                self.suback.set_result(None)
        del buf[:used]
        if acks and self.transport is not None:
            self.transport.write(bytes(acks))
        if self.wake is not None and self.received >= self.wake_rx and self.acks >= self.wake_acks:
            self.wake.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError("closed before CONNACK"))
        if self.wake is not None:
            self.wake.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def subscribe(self, topic: str, qos: int) -> None:
        self.suback = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(encode(Subscribe(1, (Subscription(topic, qos),)), 4))
        await asyncio.wait_for(self.suback, 10)


async def connect(port: int, name: str, clean: bool = True) -> Client:
    """`clean=False`: a 3.1.1 persistent session (its QoS 1 messages go through its queue)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Client(name, clean=clean), "127.0.0.1", port)
    await asyncio.wait_for(proto.connack, 10)
    return proto
