"""Start-up waits for the mesh's shared dependencies (NATS, JetStream, Redis).

A service process that starts while Redis or NATS is away (a restart of the whole mesh in any
order, a pod rescheduled while Redis fails over) waits for it, retrying with backoff and
saying so in its log, for `dependency_wait_s` (default 60 s), and reports NOT_SERVING
meanwhile; only then does start-up fail (exit 1), for the orchestrator to restart it.
Exiting at the first refused connection instead would turn a few seconds without Redis into
a crash loop whose restart back-off (minutes, in Kubernetes) outlasts the outage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import redis.exceptions
from redis.asyncio import Redis
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

log = logging.getLogger("starling.dependencies")

T = TypeVar("T")

# What a dependency that is not there (yet) raises: refused or reset connections, timeouts,
# and Redis's own connection errors (BusyLoadingError, a Redis still loading, is one).
UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


# What a JetStream API call raises while the cluster cannot answer it yet (no server, no
# meta leader after a restart, a stream without a leader): nats-py's errors, whose timeout
# and 503 answers are of them.
JETSTREAM_UNREACHABLE: tuple[type[BaseException], ...] = (*UNREACHABLE, nats.errors.Error)


async def wait_for(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    wait_s: float,
    retry_on: tuple[type[BaseException], ...] = UNREACHABLE,
) -> T:
    """`attempt()`'s result, retrying it with exponential backoff (0.1 s to 2 s) while it
    raises one of `retry_on`, for at most `wait_s` seconds; then its last error."""

    def waiting(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "dependency_unreachable",
            extra={
                "dependency": what,
                "attempt": state.attempt_number,
                "error": repr(exc),
                "waited_s": round(state.seconds_since_start or 0.0, 1),
            },
        )

    async for step in AsyncRetrying(
        stop=stop_after_delay(wait_s),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        retry=retry_if_exception_type(retry_on),
        before_sleep=waiting,
        reraise=True,
    ):
        with step:
            return await attempt()
    raise RuntimeError("unreachable")  # pragma: no cover


async def redis_ready(redis: Redis, wait_s: float) -> None:
    """Start-up: Redis answers a PING (waiting for it as `wait_for` does)."""

    async def ping() -> object:
        return await redis.ping()

    await wait_for("redis", ping, wait_s)
