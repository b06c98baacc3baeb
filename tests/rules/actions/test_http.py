"""The HTTP webhook action through its Delivery, against a real aiohttp server in the test:
transformed payloads arrive, batching, retries of 5xx/timeouts, 4xx dead-lettered at once,
replay after the endpoint recovers, and back-pressure on a slow endpoint."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.cli.ports import free_port
from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, RetryPolicy, replay
from tests.poll import eventually, holds_within_async
from tests.rules.actions.helpers import RecordingRepublisher, output

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_s=10)


@dataclass
class Hook:
    """A webhook endpoint whose answers the test scripts."""

    url: str = ""
    bodies: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in order, then 200
    delay_s: float = 0.0
    gate: asyncio.Event | None = None  # when set, requests wait for it
    calls: int = 0
    open_now: int = 0
    open_max: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        self.open_now += 1
        self.open_max = max(self.open_max, self.open_now)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay_s:
                delay, self.delay_s = self.delay_s, 0.0
                await asyncio.sleep(delay)
            status = self.statuses.pop(0) if self.statuses else 200
            if status == 200:
                self.bodies.append(json.loads(await request.read()))
                self.headers.append(dict(request.headers))
            return web.Response(status=status)
        finally:
            self.open_now -= 1


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    app = web.Application()
    app.router.add_route("*", "/hook", h.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    h.url = f"http://127.0.0.1:{port}/hook"
    yield h
    await runner.cleanup()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


def ctx(tmp_path: Path) -> ActionContext:
    return ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")


async def delivery(
    params: dict[str, str], store: SqliteDeadLetters, tmp_path: Path, **kw: Any
) -> Delivery:
    action = build_action("http", params, ctx(tmp_path))
    d = Delivery(action, "t1", "r1", store, kw.pop("retry", FAST), action_name="hook", **kw)
    await d.start()
    return d


async def test_payload_and_headers_arrive(hook: Hook, store: SqliteDeadLetters, tmp_path: Path):
    d = await delivery({"url": hook.url, "header.Authorization": "Bearer s3cret"}, store, tmp_path)
    try:
        outcome = await d.deliver([output(1, {"t": 31, "clientid": "dev-1"})])
        assert outcome.delivered and outcome.attempts == 1
        assert hook.bodies == [{"t": 31, "clientid": "dev-1"}]
        assert hook.headers[0]["Authorization"] == "Bearer s3cret"
        assert hook.headers[0]["Content-Type"] == "application/json"
    finally:
        await d.close()


async def test_batches_are_json_arrays_within_the_size(
    hook: Hook, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    d = await delivery({"url": hook.url, "batch_size": "3", "batch_ms": "300"}, store, tmp_path)
    try:
        outcomes = await asyncio.gather(*(d.deliver([output(i)]) for i in range(7)))
        assert all(o.delivered for o in outcomes)
        assert all(isinstance(b, list) and 1 <= len(b) <= 3 for b in hook.bodies)
        assert sorted(item["i"] for b in hook.bodies for item in b) == list(range(7))
        assert len(hook.bodies) == 3  # 3 + 3 + 1: the linger let the batches fill
    finally:
        await d.close()


async def test_5xx_and_timeouts_are_retried(
    hook: Hook, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    d = await delivery({"url": hook.url, "timeout_ms": "200"}, store, tmp_path)
    try:
        hook.statuses = [503, 500]
        outcome = await d.deliver([output(1)])
        assert outcome.delivered and outcome.attempts == 3
        assert hook.calls == 3 and hook.bodies == [{"t": 31, "i": 1}]
        hook.delay_s = 2.0  # the first try times out
        outcome = await d.deliver([output(2)])
        assert outcome.delivered and outcome.attempts == 2
        assert (await store.stats("t1", "r1")).count == 0
    finally:
        await d.close()


async def test_4xx_is_dead_lettered_at_once_then_replayed(
    hook: Hook, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    d = await delivery({"url": hook.url}, store, tmp_path)
    try:
        hook.statuses = [400]
        outcome = await d.deliver([output(1)])
        assert not outcome.delivered and outcome.attempts == 1 and "400" in outcome.error
        assert hook.calls == 1
        [letter] = await store.list("t1", "r1")
        assert letter.action == "hook" and "HTTP 400" in letter.error
        result = await replay(store, "t1", "r1", [letter.id], {"hook": d})
        assert (result.delivered, result.failed) == (1, 0)
        assert hook.bodies == [{"t": 31, "i": 1}]
        assert await store.list("t1", "r1") == []
    finally:
        await d.close()


async def test_retries_exhausted_go_to_dead_letters_and_replay_delivers(
    hook: Hook, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    d = await delivery({"url": hook.url, "batch_size": "10"}, store, tmp_path)
    try:
        hook.statuses = [503] * 3
        outcome = await d.deliver([output(i) for i in range(4)])
        assert not outcome.delivered and outcome.attempts == 3 and hook.calls == 3
        assert d.stats.dead_lettered == 4
        assert [x.output.message_id for x in await store.list("t1", "r1")] == [
            "m0",
            "m1",
            "m2",
            "m3",
        ]
        hook.statuses = [503] * 3  # still down: the replay keeps them
        result = await replay(store, "t1", "r1", [], {"hook": d})
        assert (result.delivered, result.failed) == (0, 4)
        assert (await store.stats("t1", "r1")).count == 4
        result = await replay(store, "t1", "r1", [], {"hook": d})  # it came back
        assert (result.delivered, result.failed) == (4, 0)
        assert [item["i"] for item in hook.bodies[0]] == [0, 1, 2, 3]
        assert (await store.stats("t1", "r1")).count == 0
    finally:
        await d.close()


async def test_slow_webhook_applies_back_pressure(
    hook: Hook, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    """A stuck endpoint: delivery holds at most max_pending outputs and the producers wait
    instead of queueing without limit; all arrive once it answers."""
    hook.gate = asyncio.Event()
    d = await delivery(
        {"url": hook.url, "batch_size": "2", "max_in_flight": "2"},
        store,
        tmp_path,
        max_pending=6,
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=60),
    )
    try:
        producers = [asyncio.create_task(d.deliver([output(i)])) for i in range(200)]
        await eventually(lambda: hook.open_now == 2, what="two requests in flight")
        await eventually(lambda: d.held == 6, what="the bound filled")
        # Must not happen: a waiting producer breaking the bound within this window.
        assert not await holds_within_async(
            lambda: d.held > 6 or any(p.done() for p in producers), 0.2
        )
        assert d.held == 6
        assert sum(p.done() for p in producers) == 0
        hook.gate.set()
        outcomes = await asyncio.gather(*producers)
        assert all(o.delivered for o in outcomes)
        assert sorted(item["i"] for b in hook.bodies for item in b) == list(range(200))
        assert hook.open_max <= 2
        assert d.held == 0
    finally:
        await d.close()


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({}, "url"),
        ({"url": "ftp://x/y"}, "url"),
        ({"url": "http://h/x", "method": "GET"}, "method"),
        ({"url": "http://h/x", "batch_size": "0"}, "batch_size"),
        ({"url": "http://h/x", "timeout_ms": "soon"}, "timeout_ms"),
        ({"url": "http://h/x", "ca_file": "/nonexistent.pem"}, "ca_file"),
        ({"url": "http://h/x", "header.Bad Name": "v"}, "header.Bad Name"),
        ({"url": "http://h/x", "retires": "3"}, "retires"),
    ],
)
def test_bad_params_name_the_param(params: dict[str, str], named: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(named)}:"):
        build_action("http", params, ctx(tmp_path))


def test_unknown_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^kind:"):
        build_action("smtp", {}, ctx(tmp_path))
