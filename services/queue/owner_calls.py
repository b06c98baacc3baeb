"""Calls of the queue client sent to the owner of a queue's partition (services/queue/owners.py
keeps the map, from the instances' announcements on ctl.queue.owners).

With one queue instance (it owns every partition) a call is exactly what it was before there
were several: one request on the instance's subject. With several, a call under way at an
instance that stops owning the queue (it died: its lease ran out and another claimed the
partition) would wait for its whole timeout; it ends at the announcement of the new owner
instead (UnavailableError), and the caller retries there. Appends are idempotent per message
id, so a retry of an append that was stored after all stores nothing twice.

A call to an owner that announced a queue link goes on it (services/queue/link.py), and over
NATS when the link cannot take it or broke under it.
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
from opentelemetry import trace

from services.common.bus import unary
from services.common.bus.large import limit
from services.common.bus.unary import (
    QUEUE_OWNERS_SUBJECT,
    ReplyTooLargeError,
    UnaryClient,
    instance_subject,
)
from services.common.rpc.client import LazyStub
from services.common.rpc.credentials import mesh_metadata
from services.common.rpc.errors import UnavailableError
from services.queue.link import HEADER_BYTES, METHODS
from services.queue.link_client import LinkDownError, LinkLostError, QueueLink
from services.queue.owners import Owner, OwnerMap
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

log = logging.getLogger("starling.queue.client")

R = TypeVar("R", bound=ProtoMessage)
# Links past which those to instances no longer announced are closed.
MAX_LINKS_KEPT = 16
Stub = LazyStub[pb_grpc.QueueServiceStub]


class OwnerCalls:
    def __init__(
        self, rpc: Stub, timeout_s: float, on_notice: Callable[[bytes], None] = lambda _: None
    ) -> None:
        self.rpc = rpc  # the configured queue address (no owner known)
        self.owners = OwnerMap()
        self.bus: UnaryClient | None = None
        self._timeout_s = timeout_s
        self._nc: Client | None = None
        self._stubs: dict[str, Stub] = {}
        self._following = False
        self._moved: asyncio.Future[None] | None = None
        # Queue links by address (services/queue/link.py): a call to an owner that announced
        # one goes there; NATS when it cannot.
        self._links: dict[str, QueueLink] = {}
        self._on_notice = on_notice
        # Bumped whenever a notice may have been lost: a partition changed owner, a link
        # opened or broke (or the caller says so: `changed`). Readers poll when it moves.
        self.generation = 0

    def changed(self) -> None:
        self.generation += 1

    def use_bus(self, nc: Client) -> None:
        self._nc = nc
        self.bus = UnaryClient(nc, self._timeout_s)

    def _link(self, owner: Owner) -> QueueLink | None:
        if not owner.link_address or self._nc is None:
            return None
        link = self._links.get(owner.link_address)
        if link is None:
            secret = next((v for k, v in mesh_metadata()), "")
            # A frame holds what one NATS message holds: the same requests fit both.
            max_frame = limit(self._nc) + HEADER_BYTES + 1
            try:
                link = QueueLink(
                    owner.link_address, secret, max_frame, self._on_notice, self.changed
                )
            except ValueError:  # a bad announcement: this instance's calls go over NATS
                log.warning("queue_link_address_invalid", extra={"address": owner.link_address})
                return None
            self._forget_links()
            self._links[owner.link_address] = link
        return link

    def _forget_links(self) -> None:
        """Close the links of instances no longer announced (a restarted instance comes
        back at another port)."""
        if len(self._links) < MAX_LINKS_KEPT:
            return
        live = self.owners.link_addresses()
        for address in [a for a in self._links if a not in live]:
            self._links.pop(address).close()

    async def _at(
        self,
        owner: Owner,
        subject: str,
        rpc: Stub,
        method: Callable[[Stub], Callable[..., Awaitable[R]]],
        req: ProtoMessage,
        reply: type[R],
    ) -> R:
        """`req` at `owner`: on its link if it has one (a traced call keeps NATS, whose
        headers carry its span context), else over NATS (or gRPC, for the large)."""
        link = self._link(owner)
        code = METHODS.get(subject)
        if link is not None and code is not None and not trace.get_current_span().is_recording():
            try:
                data = req.SerializeToString()
                return reply.FromString(await link.call(code, data, self._timeout_s))
            except (LinkDownError, LinkLostError):
                pass  # not sent, or the link broke under it: NATS (every call may repeat)
            except ReplyTooLargeError:
                return await rpc.call(method(rpc), req)
        own = instance_subject(subject, owner.instance_id)
        return await unary.call(self.bus, own, rpc, method(rpc), req, reply)

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
            self.changed()
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
        call = self._at(owner, subject, self._stub(owner), method, req, reply)
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
        for link in self._links.values():
            link.close()
        for stub in self._stubs.values():
            await stub.close()
