"""The process runtime around every service (services/common/runtime.py): health says
SERVING only once the service has started, and on shutdown the calls under way finish while
everything the service holds is still open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

import grpc

from services.cli.ports import free_port
from services.common.config import ServiceSettings
from services.common.rpc.server import check_health
from services.common.runtime import serve
from tests.poll import eventually, holds_within_async

METHOD = "/starling.test.Slow/Call"


class SlowService:
    """A service whose start and whose one RPC wait until the test lets them go on."""

    def __init__(self) -> None:
        self.may_start = asyncio.Event()
        self.in_call = asyncio.Event()
        self.may_answer = asyncio.Event()
        self.closed = False  # what `stop` closes (a store, a client)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.in_call.set()
            await self.may_answer.wait()
            return b"closed" if self.closed else b"open"

        handler = grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=None, response_serializer=None
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("starling.test.Slow", {"Call": handler}),)
        )
        return ["starling.test.Slow"]

    async def start(self) -> None:
        await self.may_start.wait()

    async def stop(self) -> None:
        self.closed = True


@contextlib.asynccontextmanager
async def _serving(service: SlowService) -> AsyncIterator[tuple[str, asyncio.Task[None]]]:
    port = free_port()
    settings = ServiceSettings(
        grpc_port=port, mesh_auth="disabled", admin_auth="disabled", shutdown_grace_s=5.0
    )
    task = asyncio.create_task(serve(settings, service, "slow"))
    try:
        yield f"127.0.0.1:{port}", task
    finally:
        service.may_start.set()
        service.may_answer.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _first_status(address: str, wanted: Callable[[str], bool]) -> str:
    """Poll the health of `address` until `wanted` (at most 10 s); that status."""

    async def status() -> str:
        answer = await check_health(address)
        return answer if wanted(answer) else ""

    return await eventually(status, 10, f"a wanted health status of {address}")


async def test_health_is_not_serving_while_the_service_starts() -> None:
    # The launcher (and an orchestrator) takes SERVING as "clients may connect": a node
    # still binding its MQTT listeners would refuse them.
    service = SlowService()
    async with _serving(service) as (address, _):
        status = await _first_status(address, lambda s: s != "UNREACHABLE")
        assert status == "NOT_SERVING"  # the gRPC server is up, the service is not
        service.may_start.set()
        assert await _first_status(address, lambda s: s == "SERVING") == "SERVING"


async def test_calls_under_way_at_shutdown_finish_before_the_service_stops() -> None:
    # A call answered after `stop` closed the service's store fails (or hangs until the grace
    # period ends): the session service failed QoS 2 records that way under SIGTERM.
    service = SlowService()
    service.may_start.set()
    async with _serving(service) as (address, task):
        assert await _first_status(address, lambda s: s == "SERVING") == "SERVING"
        async with grpc.aio.insecure_channel(address) as ch:
            call = ch.unary_unary(METHOD)(b"", timeout=10)
            await service.in_call.wait()
            task.cancel()  # as SIGTERM does: serve() shuts down
            # Give a wrong order every chance to show: stop() would run at once. A short
            # window to show something does not happen (the call below must still answer).
            await holds_within_async(lambda: service.closed, 0.5)
            service.may_answer.set()
            assert await call == b"open"
        await eventually(lambda: service.closed, 10, "the service stopped")
