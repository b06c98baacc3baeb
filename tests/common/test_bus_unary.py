"""Unary calls over NATS request/reply (services/common/bus/unary.py) against a real NATS."""

from __future__ import annotations

import asyncio

import nats
import pytest

from services.common.bus.unary import UnaryClient, UnaryServer
from services.common.rpc.errors import InvalidArgumentError, ServiceError, UnavailableError


async def test_a_call_is_answered_and_errors_keep_their_status(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:

        async def handler(data: bytes) -> bytes:
            if data == b"bad":
                raise InvalidArgumentError("entries[0] needs queue_id")
            if data == b"boom":
                raise RuntimeError("bug")
            return data[::-1]

        server = UnaryServer(nc, "svc.test.echo", "test", handler)
        await server.start()
        client = UnaryClient(nc, timeout_s=2.0)
        assert await client.call("svc.test.echo", b"abc") == b"cba"
        with pytest.raises(InvalidArgumentError, match="entries\\[0\\] needs queue_id"):
            await client.call("svc.test.echo", b"bad")
        with pytest.raises(ServiceError) as info:  # an unexpected failure: INTERNAL, no details
            await client.call("svc.test.echo", b"boom")
        assert info.value.code.name == "INTERNAL" and "RuntimeError" in info.value.details
        await server.stop()
        with pytest.raises(UnavailableError):  # nobody serves the subject: retryable
            await client.call("svc.test.echo", b"abc")
    finally:
        await nc.close()


async def test_requests_are_served_concurrently(nats_url: str) -> None:
    """A slow request does not hold up the next one (the router awaits the queue)."""
    nc = await nats.connect(nats_url)
    try:
        release = asyncio.Event()

        async def handler(data: bytes) -> bytes:
            if data == b"slow":
                await release.wait()
            return data

        server = UnaryServer(nc, "svc.test.slow", "test", handler)
        await server.start()
        client = UnaryClient(nc, timeout_s=2.0)
        slow = asyncio.ensure_future(client.call("svc.test.slow", b"slow"))
        assert await client.call("svc.test.slow", b"fast") == b"fast"
        assert not slow.done()
        release.set()
        assert await slow == b"slow"
        assert client.fits(1000) and not client.fits(nc.max_payload)  # big ones go by gRPC
        await server.stop()
    finally:
        await nc.close()
