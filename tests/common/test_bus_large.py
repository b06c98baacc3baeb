"""Payloads larger than one NATS message, against a real nats-server (max_payload 1 MB, its
default): published by reference, fetched whole in pieces, bounded on both sides."""

from __future__ import annotations

import asyncio
import os
import uuid

from nats.aio.msg import Msg

from services.common.bus.client import connect
from services.common.bus.flushing import flushed
from services.common.bus.large import REF_HEADER, Fetcher, Holder, limit


async def _receive_one(nats_url: str, payload_of: Holder, data: bytes) -> bytes | None:
    pub = await connect(nats_url, "large-pub")
    sub = await connect(nats_url, "large-sub")
    try:
        await payload_of.start(pub)
        got: asyncio.Queue[Msg] = asyncio.Queue()

        async def on(msg: Msg) -> None:
            await got.put(msg)

        subject = f"mq.t{uuid.uuid4().hex[:6]}.big"
        await sub.subscribe(subject, cb=on)
        await flushed(sub)
        # Core NATS is at most once: in one clean-clone CI run a single PUB never arrived
        # (10 s, the subscription confirmed by its flush; not seen in 28 runs here),
        # so the payload is sent again until a copy arrives; what is asserted is its form.
        for _ in range(10):
            await payload_of.publish(pub, subject, data)
            await flushed(pub)
            try:
                msg = await asyncio.wait_for(got.get(), 2)
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError(f"nothing arrived on {subject} in 10 tries")
        assert len(msg.data) <= limit(pub)
        return await Fetcher(sub).resolve(msg)
    finally:
        await pub.close()
        await sub.close()


async def test_a_payload_over_max_payload_arrives_whole(nats_url: str) -> None:
    data = os.urandom(5 << 20)  # five times the server's max_payload
    assert await _receive_one(nats_url, Holder("n1", max_bytes=64 << 20), data) == data


async def test_a_small_payload_goes_as_is(nats_url: str) -> None:
    assert await _receive_one(nats_url, Holder("n2", max_bytes=1), b"small") == b"small"


async def test_the_holder_is_bounded_and_a_dropped_payload_is_skipped(nats_url: str) -> None:
    holder = Holder("n3", max_bytes=3 << 20)
    first = holder.hold(bytes(2 << 20))
    holder.hold(bytes(2 << 20))  # over the bound: the oldest goes
    assert holder.held_bytes == 2 << 20
    nc = await connect(nats_url, "large-gone")
    try:
        await holder.start(nc)
        msg = Msg(nc, subject="x", data=b"", headers={REF_HEADER: first})
        assert await Fetcher(nc).resolve(msg) is None
    finally:
        await nc.close()


def test_held_payloads_expire() -> None:
    holder = Holder("n4", max_bytes=1 << 30, hold_s=-1.0)  # everything held is already too old
    holder.hold(b"x" * 100)
    holder.hold(b"y")  # holding expires what is older than hold_s
    assert holder.held_bytes == 1
