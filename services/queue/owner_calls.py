"""Calls of the queue client sent to the owner of a queue's partition (services/queue/owners.py
keeps the map, from the instances' announcements on ctl.queue.owners).

With one queue instance (it owns every partition) a call is exactly what it was before there
were several: one request on the instance's subject. With several, a call under way at an
instance that stops owning the queue (it died: its lease ran out and another claimed the
partition) would wait for its whole timeout; it ends at the announcement of the new owner
instead (UnavailableError), and the caller retries there. Appends are idempotent per message
id, so a retry of an append that was stored after all stores nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import unary
from services.common.bus.unary import QUEUE_OWNERS_SUBJECT, UnaryClient, instance_subject
from services.common.rpc.client import LazyStub
from services.common.rpc.errors import UnavailableError
from services.queue.owners import Owner, OwnerMap
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

log = logging.getLogger("starling.queue.client")

R = TypeVar("R", bound=ProtoMessage)
Stub = LazyStub[pb_grpc.QueueServiceStub]


class OwnerCalls:
    def __init__(self, rpc: Stub, timeout_s: float) -> None:
        self.rpc = rpc  # the configured queue address (no owner known)
        self.owners = OwnerMap()
        self.bus: UnaryClient | None = None
        self._timeout_s = timeout_s
        self._nc: Client | None = None
        self._stubs: dict[str, Stub] = {}
        self._following = False
        self._moved: asyncio.Future[None] | None = None

    def use_bus(self, nc: Client) -> None:
        self._nc = nc
        self.bus = UnaryClient(nc, self._timeout_s)

    async def follow(self) -> None:
        """Listen to the owners' announcements (once; at the first call)."""
        if self._following or self._nc is None:
            return
        self._following = True
        await self._nc.subscribe(QUEUE_OWNERS_SUBJECT, cb=self._on_owners)

    async def _on_owners(self, msg: Msg) -> None:
        try:
            ann = pb.QueueOwners.FromString(msg.data)
        except DecodeError:  # only queue instances may publish here (NATS permissions)
            log.warning("queue_owners_malformed")
            return
        if self.owners.learn(ann):
            moved, self._moved = self._moved, None
            if moved is not None and not moved.done():
                moved.set_result(None)

    def moved(self) -> asyncio.Future[None]:
        """Resolved at the next change of any partition's owner."""
        if self._moved is None:
            self._moved = asyncio.get_running_loop().create_future()
        return self._moved

    def _stub(self, owner: Owner | None) -> Stub:
        if owner is None or not owner.grpc_address:
            return self.rpc
        stub = self._stubs.get(owner.grpc_address)
        if stub is None:
            stub = self._stubs[owner.grpc_address] = LazyStub(
                owner.grpc_address, pb_grpc.QueueServiceStub, timeout_s=self._timeout_s
            )
        return stub

    async def call(
        self,
        owner: Owner | None,
        keys: Sequence[tuple[str, str]],
        subject: str,
        method: Callable[[Stub], Callable[..., Awaitable[R]]],
        req: ProtoMessage,
        reply: type[R],
    ) -> R:
        """`req` at `owner` (None: any instance, on the shared subject) for the queues `keys`
        ((tenant, queue_id)); UnavailableError if it stops owning one of them meanwhile."""
        if owner is None:
            return await unary.call(self.bus, subject, self.rpc, method(self.rpc), req, reply)
        rpc = self._stub(owner)
        call = unary.call(
            self.bus, instance_subject(subject, owner.instance_id), rpc, method(rpc), req, reply
        )
        if self.owners.sole is not None:
            return await call  # one instance: nothing to move to
        task = asyncio.ensure_future(call)
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {task, self.moved()}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    return task.result()
                if any(self.owners.owner(t, q) != owner for t, q in keys):
                    raise UnavailableError(f"queue owner {owner.instance_id} gave its queues up")
        finally:
            if not task.done():
                task.cancel()

    async def close(self) -> None:
        for stub in self._stubs.values():
            await stub.close()
