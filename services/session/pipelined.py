"""Calls of one Redis Lua script made in the same event-loop turn, sent together: as one
pipeline of a call each (`PipelinedScript`), or as one call of a script written to loop over
them (`BatchedScript`).

Why: in a reconnect storm the session service answers hundreds of CONNECTs at once, each one
registry script call. Sent one by one, every call pays redis-py's per-command work and a
socket write of its own (a third of the service's CPU per CONNECT, measured with
bench/connects.py); sent together they share one write and one read. Each caller still gets
its own reply or its own error, and nothing waits for a batch to fill: the pipeline leaves at
the end of the loop turn in which the first call was made. Calls are independent (the caller
orders calls of one client id with its own lock), so they need no transaction.

Redis Cluster: each call's keys share one slot (the callers' hash tags). A pipeline of calls
is split by redis-py's cluster pipeline, a command per call to the node of its slot; a
`BatchedScript` call names the keys of several calls, so its batch is split by slot first
(one script call per slot of the turn).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError

from services.common.tasks import TaskSet

# Calls per pipeline: the session service answers at most a few hundred requests at once
# (services/common/bus/unary.py MAX_IN_FLIGHT), so this only splits an unusual burst.
MAX_BATCH = 512

_Call = tuple[list[Any], list[Any], "asyncio.Future[Any]"]


class _TurnCalls:
    """Calls of one Redis Lua script collected over an event-loop turn and sent together
    at its end (`_send`, at most MAX_BATCH calls each), by digest (EVALSHA), not through
    redis-py's pipeline scripts, which ask Redis whether the script is loaded (SCRIPT
    EXISTS) before every pipeline: a Redis that lost it (restart, SCRIPT FLUSH) answers
    NOSCRIPT, and the calls go again after SCRIPT LOAD."""

    def __init__(self, redis: Redis, script: str) -> None:
        self._redis = redis
        self._source = script
        self._sha = redis.register_script(script).sha
        self._pending: list[_Call] = []
        self._scheduled = False
        self._tasks = TaskSet()

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, done))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send_pending)
        return await done

    def _send_pending(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for group in self._groups(pending):
            for i in range(0, len(group), MAX_BATCH):
                self._tasks.spawn(self._send(group[i : i + MAX_BATCH]), name="redis_script")

    def _groups(self, pending: list[_Call]) -> list[list[_Call]]:
        """The calls that may go together (all of them, unless a subclass says otherwise)."""
        return [pending]

    async def _send(self, calls: list[_Call]) -> None:
        raise NotImplementedError

    @staticmethod
    def _fail(calls: list[_Call], exc: Exception) -> None:
        for *_, done in calls:
            if not done.done():
                done.set_exception(exc)


class PipelinedScript(_TurnCalls):
    """One call of the script per caller, all in one pipeline."""

    async def _send(self, calls: list[_Call]) -> None:
        try:
            replies = await self._pipeline(calls)
            if any(isinstance(r, NoScriptError) for r in replies):
                await self._redis.script_load(self._source)
                replies = await self._pipeline(calls)
        except Exception as exc:  # the connection failed: every call of the batch did
            self._fail(calls, exc)
            return
        for (*_, done), reply in zip(calls, replies, strict=True):
            if done.done():  # its caller gave up (cancelled)
                continue
            if isinstance(reply, Exception):
                done.set_exception(reply)
            else:
                done.set_result(reply)

    async def _pipeline(self, calls: list[_Call]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, args, _ in calls:
                # Not pipe.evalsha: redis-py's cluster pipeline blocks that method, while
                # its EVALSHA routes by the call's keys like any keyed command.
                pipe.execute_command("EVALSHA", self._sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))


class BatchedScript(_TurnCalls):
    """Calls of one Redis Lua script made in the same event-loop turn, sent as ONE call of
    it: KEYS are each call's keys one after the other, ARGV the `shared` arguments and then
    each call's, and the script answers a flat list of `reply_len` items per call, in call
    order. Where `PipelinedScript` saves the socket writes, this also saves redis-py's
    per-command work (packing, parsing: most of a pipeline's cost) and Redis's per-script
    set-up, for scripts written to loop over their calls (services/session/flapping.py).
    A failing script fails every call of its batch."""

    def __init__(self, redis: Redis, script: str, shared: list[Any], reply_len: int) -> None:
        super().__init__(redis, script)
        self._shared = shared
        self._reply_len = reply_len
        self._cluster = isinstance(redis, RedisCluster)

    def _groups(self, pending: list[_Call]) -> list[list[_Call]]:
        """On a cluster, one group per slot (of each call's first key: a call's keys share
        it); on one Redis, all of them."""
        if not self._cluster:
            return [pending]
        by_slot: dict[int, list[_Call]] = {}
        for call in pending:
            by_slot.setdefault(key_slot(str(call[0][0]).encode()), []).append(call)
        return list(by_slot.values())

    async def _send(self, calls: list[_Call]) -> None:
        keys = [k for ks, _, _ in calls for k in ks]
        args = [*self._shared, *(a for _, call_args, _ in calls for a in call_args)]
        try:
            try:
                reply = await self._redis.evalsha(self._sha, len(keys), *keys, *args)
            except NoScriptError:  # Redis lost it (restart, SCRIPT FLUSH)
                await self._redis.script_load(self._source)
                reply = await self._redis.evalsha(self._sha, len(keys), *keys, *args)
        except Exception as exc:
            self._fail(calls, exc)
            return
        n = self._reply_len
        for i, (*_, done) in enumerate(calls):
            if not done.done():  # its caller may have given up (cancelled)
                done.set_result(list(reply[i * n : (i + 1) * n]))
