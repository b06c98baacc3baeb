"""Publishing into the mesh: a client's messages batched onto NATS subjects, in order.

Theory of operation: `batch_for(subject)` returns the batch a message joins: the last one if it
goes to the same subject and has room, else a new one. Consecutive publishes to one topic thus
share a NATS message (`RoutedBatch`), and per-topic order is kept because one task (`run`)
publishes the batches in the order they were opened.

Under load a PING/PONG barrier (`flush`) follows every FLUSH_EVERY messages, and they count as
queued until it returns: NATS answers after routing everything published before it, so what
NATS still holds for this node shows in the subscriptions' pending bytes, where flow control
sees it, instead of hiding in server buffers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from nats.aio.client import Client

from starling.common.v1.message_pb2 import RoutedBatch

log = logging.getLogger("starling.connection.mesh")

MAX_BATCH = 64  # messages per NATS message
FLUSH_EVERY = 1000  # messages between PING/PONG barriers under load


class MessageIds:
    """Message ids unique across nodes and restarts: node id, the start time of this node
    process in nanoseconds, a counter. The queue's de-duplication keys on them, so a restarted
    node must never hand out an id it used before."""

    __slots__ = ("_counter", "prefix")

    def __init__(self, node_id: str, started_ns: int) -> None:
        self.prefix = f"{node_id}-{started_ns:x}-"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return self.prefix + str(next(self._counter))


class MeshPublisher:
    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._batches: list[tuple[str, RoutedBatch]] = []  # in publish order
        self.queued = 0  # messages handed over and not yet confirmed by NATS
        self._wake = asyncio.Event()

    def batch_for(self, subject: str) -> RoutedBatch:
        batches = self._batches
        if batches:
            last_subject, last = batches[-1]
            if last_subject == subject and len(last.messages) < MAX_BATCH:
                return last
        batch = RoutedBatch()
        batches.append((subject, batch))
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
            unconfirmed = 0
            for subject, batch in pending:
                try:
                    await nc.publish(subject, batch.SerializeToString())
                except Exception:  # never let one publish stop the node
                    log.exception("mesh_publish_failed", extra={"subject": subject})
                unconfirmed += len(batch.messages)
            if unconfirmed >= FLUSH_EVERY:
                try:
                    await nc.flush(timeout=5)
                except Exception:  # a slow or lost barrier must not stop publishing
                    log.warning("mesh_flush_failed")
            self.queued -= unconfirmed
            if self._batches:
                self._wake.set()
