"""Publishing into the mesh: a client's messages batched onto NATS subjects, in order.

Theory of operation: `batch_for(subject, size)` returns the batch a message joins: the last one
if it goes to the same subject and has room (MAX_BATCH messages, BATCH_BYTES), else a new one.
Consecutive publishes to one topic thus share a NATS message (`RoutedBatch`), and per-topic
order is kept because one task (`run`) publishes the batches in the order they were opened.
A batch is cut again by its exact size below the server's max_payload, and a single message
larger than that goes by reference (services/common/bus/large.py): NATS never refuses one,
and nothing is dropped after PUBACK for being large.

Under load a PING/PONG barrier (`flush`) follows every FLUSH_EVERY messages, and they count as
queued until it returns: NATS answers after routing everything published before it, so what
NATS still holds for this node shows in the subscriptions' pending bytes, where flow control
sees it, instead of hiding in server buffers.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from services.common.bus.flushing import flushed
from services.common.bus.large import Holder, limit
from services.common.rpc.limits import BATCH_BYTES, split_by_bytes
from starling.common.v1.message_pb2 import RoutedBatch

log = logging.getLogger("starling.connection.mesh")

MAX_BATCH = 64  # messages per NATS message
FLUSH_EVERY = 1000  # messages between PING/PONG barriers under load


def pieces(batch: RoutedBatch, max_bytes: int) -> list[bytes]:
    """`batch` serialized as one or more RoutedBatch payloads, in order, each at most
    `max_bytes` unless it holds a single message larger than that."""
    data = batch.SerializeToString()
    if len(data) <= max_bytes:
        return [data]
    # A message's framing inside the batch: a tag and a length prefix.
    runs = split_by_bytes(batch.messages, lambda m: m.ByteSize() + 6, max_bytes)
    return [RoutedBatch(messages=run).SerializeToString() for run in runs]


class MeshPublisher:
    def __init__(self, nc: Client, holder: Holder | None = None) -> None:
        self._nc = nc
        self._holder = holder  # publishes what is larger than one NATS message
        self._batches: list[tuple[str, RoutedBatch]] = []  # in publish order
        self._last_bytes = 0  # estimated size of the last batch
        self.queued = 0  # messages handed over and not yet confirmed by NATS
        self._wake = asyncio.Event()

    def batch_for(self, subject: str, size: int = 0) -> RoutedBatch:
        """The batch a message of about `size` bytes (payload and topic) to `subject` joins."""
        batches = self._batches
        if batches:
            last_subject, last = batches[-1]
            if (
                last_subject == subject
                and len(last.messages) < MAX_BATCH
                and self._last_bytes + size <= BATCH_BYTES
            ):
                self._last_bytes += size
                return last
        batch = RoutedBatch()
        batches.append((subject, batch))
        self._last_bytes = size
        return batch

    def added(self, n: int) -> None:
        """`n` messages joined batches: wake the publishing task."""
        self.queued += n
        self._wake.set()

    async def run(self) -> None:
        nc = self._nc
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._batches = self._batches, []
            self._last_bytes = 0
            unconfirmed = 0
            max_bytes = limit(nc)
            for subject, batch in pending:
                try:
                    for data in pieces(batch, max_bytes):
                        if self._holder is not None:
                            await self._holder.publish(nc, subject, data)
                        else:
                            await nc.publish(subject, data)
                except Exception:  # never let one publish stop the node
                    log.exception("mesh_publish_failed", extra={"subject": subject})
                unconfirmed += len(batch.messages)
            if unconfirmed >= FLUSH_EVERY:
                try:
                    await flushed(nc, 5)
                except Exception:  # a slow or lost barrier must not stop publishing
                    log.warning("mesh_flush_failed")
            self.queued -= unconfirmed
            if self._batches:
                self._wake.set()
