"""Start-up waits (services/common/dependencies.py, services/common/bus/client.connect): a
dependency that is not there yet is retried with backoff, within a bound, and a first NATS
connection ends at the bound instead of hanging."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from services.cli.ports import free_port
from services.common.bus.client import connect
from services.common.dependencies import redis_ready, wait_for


async def test_a_dependency_that_comes_back_is_waited_for() -> None:
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError("not yet")
        return "up"

    assert await wait_for("thing", attempt, 10.0) == "up"
    assert calls == 3


async def test_one_that_stays_away_fails_with_its_error_at_the_bound() -> None:
    async def attempt() -> None:
        raise ConnectionRefusedError("down")

    began = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        await wait_for("thing", attempt, 0.5)
    assert time.monotonic() - began < 5.0


async def test_an_error_that_is_not_an_outage_is_not_retried() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad request")

    with pytest.raises(ValueError):
        await wait_for("thing", attempt, 10.0)
    assert calls == 1


async def test_a_first_nats_connection_ends_at_the_bound() -> None:
    # nats-py retries a first connection forever by itself: without the bound, this hangs.
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not accept a connection"):
        await connect(f"nats://127.0.0.1:{free_port()}", "t", wait_s=1.0)
    assert time.monotonic() - began < 10.0


async def test_redis_ready_waits_for_a_ping(redis_url: str) -> None:
    up = Redis.from_url(redis_url)
    try:
        await redis_ready(up, 5.0)
    finally:
        await up.aclose()
    down = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(RedisConnectionError):
            await redis_ready(down, 0.5)
    finally:
        await down.aclose()
