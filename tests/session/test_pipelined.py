"""Registry script calls made together share one Redis pipeline (services/session/pipelined.py),
against a real Redis: each caller gets its own reply or its own error, a Redis that lost the
script (SCRIPT FLUSH, as after a restart) is given it again, and a caller that gave up does not
break the batch."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.session.pipelined import PipelinedScript

# INCR a key, or fail on request: a reply that tells calls apart, and an error of one call.
SCRIPT = """
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
"""


async def _script_exists_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


async def test_concurrent_calls_share_a_pipeline_and_keep_their_own_replies(
    redis_url: str,
) -> None:
    redis = Redis.from_url(redis_url)
    try:
        script = PipelinedScript(redis, SCRIPT)
        keys = [f"pipelined:{uuid.uuid4().hex}" for _ in range(300)]
        before = await _script_exists_calls(redis)
        replies = await asyncio.gather(*(script([k], [i + 1]) for i, k in enumerate(keys)))
        assert replies == [i + 1 for i in range(len(keys))]
        # No SCRIPT EXISTS round trip before each pipeline (redis-py's pipelined scripts).
        assert await _script_exists_calls(redis) == before
        assert [int(v) for v in await redis.mget(keys)] == [i + 1 for i in range(len(keys))]
    finally:
        await redis.aclose()


async def test_one_failing_call_fails_alone(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        script = PipelinedScript(redis, SCRIPT)
        key = f"pipelined:{uuid.uuid4().hex}"
        results = await asyncio.gather(
            script([key], [1]), script([key], ["fail"]), script([key], [2]), return_exceptions=True
        )
        assert results[0] == 1 and results[2] == 3
        assert isinstance(results[1], ResponseError) and "asked to fail" in str(results[1])
    finally:
        await redis.aclose()


async def test_a_redis_that_lost_the_script_gets_it_again(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        script = PipelinedScript(redis, SCRIPT)
        key = f"pipelined:{uuid.uuid4().hex}"
        assert await script([key], [1]) == 1
        await redis.script_flush()
        assert await asyncio.gather(script([key], [1]), script([key], [1])) in ([2, 3], [3, 2])
    finally:
        await redis.aclose()


async def test_a_cancelled_caller_leaves_the_others_their_replies(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        script = PipelinedScript(redis, SCRIPT)
        key = f"pipelined:{uuid.uuid4().hex}"
        gone = asyncio.ensure_future(script([key], [1]))
        kept = asyncio.ensure_future(script([key], [10]))
        await asyncio.sleep(0)  # both queued in this loop turn
        gone.cancel()
        assert await kept in (10, 11)
        # The cancelled call was still sent with the batch: what a caller gave up on may
        # have happened (as with any request whose reply is lost).
        assert int(await redis.get(key) or 0) in (10, 11)
    finally:
        await redis.aclose()
