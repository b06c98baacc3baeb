"""The node's pipeline to the router for QoS>=1 publishes.

Theory of operation: publishes wait in one FIFO; one task sends them in batches (everything
queued, up to MAX_BATCH messages and BATCH_BYTES, a larger message alone: see
services/common/rpc/limits.py), up to MAX_IN_FLIGHT batches at once, and, on each answer,
releases their PUBACK/PUBREC. A publisher has at most one batch under way: what it sends
meanwhile waits behind it, so its messages reach the router in the order it sent them. A message
the router did not settle (TRY_LATER, or the call failed) moves to its publisher's retry lane,
and so does everything that publisher sends after it, so its messages still reach the queues
in the order it sent them; the FIFO goes on for every other publisher: one publisher's
failing batch never makes another tenant's publishes wait. A second task retries the lanes
with backoff and the same message ids, so a retry after the router (or the queue) died
cannot store a message twice. A lane that makes no progress for `give_up_s` is dropped and
its publisher disconnected without an ack; it resends after reconnecting, which MQTT allows
for unacknowledged QoS 1/2.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Generic, Protocol, TypeVar

from services.common.rpc.limits import BATCH_BYTES
from services.router.client import RouteResult
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.connection.routing")

# Messages per batch. Not "everything queued": one batch of all waiting publishers kept the node
# and the queue in lock-step (the queue idle while the node built the batch and settled its
# PUBACKs, the node idle while the queue stored it); capped, two or three batches overlap.
# 8 persistent QoS 1 pairs on 2 cores: about 34,000 msg/s with 1,000, 41,000 with 256 to 512,
# 34,000 with 64 (per-call costs take over).
MAX_BATCH: Final = 256
# Batches under way at once (publishers differ between them): a batch that takes long, such
# as one large message stored in many queues, does not hold up the others.
MAX_IN_FLIGHT: Final = 16
_DONE: Final = {
    RouteResult.STORED,
    RouteResult.NO_MATCH,
    RouteResult.QUOTA_EXCEEDED,
    RouteResult.QUEUE_QUOTA_EXCEEDED,
}
_FIRST_DELAY_S: Final = 0.05
_MAX_DELAY_S: Final = 1.0
_BATCH_BYTES: Final = BATCH_BYTES

P = TypeVar("P")  # the publisher (a connection; None for wills and delayed releases)
Stamp = tuple[str, int]  # a message's tenant and `published_at_ms`


class Router(Protocol):
    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]: ...


class RoutingPipeline(Generic[P]):
    def __init__(
        self,
        router: Router,
        on_done: Callable[[P | None, int, RouteResult], None],
        on_give_up: Callable[[P | None], None],
        give_up_s: float = 30.0,
        on_acked: Callable[[list[Stamp]], None] | None = None,
    ) -> None:
        self._router = router
        # Told of the settled messages a publisher's ack waited for (latency figures): their
        # tenants and publish times.
        self._on_acked = on_acked
        self._on_done = on_done
        self._on_give_up = on_give_up
        self._give_up_s = give_up_s
        self._queue: deque[tuple[P | None, int, RoutedMessage, int, Stamp]] = deque()
        self._wake = asyncio.Event()
        # Publishers with messages waiting for a retry, each with its messages in order and
        # the time its lane last made progress (or began).
        self._lanes: dict[P | None, deque[tuple[P | None, int, RoutedMessage, int, Stamp]]] = {}
        self._since: dict[P | None, float] = {}
        self._retry_wake = asyncio.Event()
        # Publishers with a batch in flight, each with the messages it sent meanwhile.
        self._busy: dict[P | None, deque[tuple[P | None, int, RoutedMessage, int, Stamp]]] = {}

    def __len__(self) -> int:
        held = sum(len(lane) for lane in self._lanes.values()) if self._lanes else 0
        held += sum(len(w) for w in self._busy.values()) if self._busy else 0
        return len(self._queue) + held

    def submit(
        self,
        publisher: P | None,
        pid: int,
        env: RoutedMessage,
        size: int = -1,
        stamp: Stamp | None = None,
    ) -> None:
        """Route `env`; `pid` is the publisher's packet id to acknowledge (0: none). What the
        caller knows already, so as not to read it back from `env` (each read of a protobuf
        field builds a Python object): `size`, at least its encoded size, for the batch budget
        (-1: `env.ByteSize()`, which encodes it; ingress.py's `envelope_size_bound` costs
        nothing), and `stamp`, its tenant and `published_at_ms`."""
        if size < 0:
            size = env.ByteSize()
        if stamp is None:
            stamp = (env.tenant, env.published_at_ms)
        self._queue.append((publisher, pid, env, size, stamp))
        self._wake.set()

    async def run(self) -> None:
        retrying = asyncio.ensure_future(self._retry_lanes())
        flights: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue and len(flights) < MAX_IN_FLIGHT:
                    batch = self._next_batch()
                    if not batch:
                        continue
                    busy = self._busy
                    for publisher, _, _, _, _ in batch:
                        if publisher not in busy:  # not setdefault: a deque per message
                            busy[publisher] = deque()
                    task = asyncio.ensure_future(self._fly(batch))
                    flights.add(task)
                    task.add_done_callback(flights.discard)
        finally:
            retrying.cancel()
            for task in flights:
                task.cancel()

    async def _fly(self, batch: list[tuple[P | None, int, RoutedMessage, int, Stamp]]) -> None:
        try:
            self._settle(batch, await self._attempt(batch))
        finally:
            self._wake.set()  # a slot is free, and the publishers' held messages may go

    def _next_batch(self) -> list[tuple[P | None, int, RoutedMessage, int, Stamp]]:
        """The next batch from the FIFO; messages of a publisher with a batch in flight or a
        retry lane wait behind its earlier ones instead."""
        queue, lanes, busy = self._queue, self._lanes, self._busy
        batch: list[tuple[P | None, int, RoutedMessage, int, Stamp]] = []
        total = 0
        in_batch: set[P | None] = set()
        while queue and len(batch) < MAX_BATCH:
            item = queue[0]
            lane = lanes.get(item[0])
            if lane is None and item[0] not in in_batch:
                lane = busy.get(item[0])
            if lane is not None:
                lane.append(queue.popleft())
                continue
            n = item[3]
            if batch and total + n > _BATCH_BYTES:
                break
            batch.append(queue.popleft())
            in_batch.add(item[0])
            total += n
        return batch

    async def _attempt(
        self, batch: list[tuple[P | None, int, RoutedMessage, int, Stamp]]
    ) -> list[RouteResult]:
        try:
            return await self._router.route([item[2] for item in batch])
        except Exception as exc:  # router down or slow: retry the same messages
            log.warning("router_unavailable", extra={"error": type(exc).__name__})
            return [RouteResult.TRY_LATER] * len(batch)

    def _settle(
        self,
        batch: list[tuple[P | None, int, RoutedMessage, int, Stamp]],
        results: list[RouteResult],
    ) -> None:
        """Release what the router settled; the rest goes to its publisher's lane, and what
        the publisher sent meanwhile follows (behind it in the lane, or back at the front of
        the FIFO)."""
        acked = []
        publishers: dict[P | None, None] = {}  # in batch order
        for item, result in zip(batch, results, strict=True):
            publishers[item[0]] = None
            if result in _DONE:
                self._on_done(item[0], item[1], result)
                if item[1]:
                    acked.append(item[4])
                continue
            lane = self._lanes.get(item[0])
            if lane is None:
                lane = self._lanes[item[0]] = deque()
                self._since[item[0]] = time.monotonic()
            lane.append(item)
        for publisher in publishers:
            held = self._busy.pop(publisher, None)
            if not held:
                continue
            lane = self._lanes.get(publisher)
            if lane is not None:
                lane.extend(held)
            else:
                self._queue.extendleft(reversed(held))
        if self._lanes:
            self._retry_wake.set()
        if acked and self._on_acked is not None:
            self._on_acked(acked)

    async def _retry_lanes(self) -> None:
        delay = _FIRST_DELAY_S
        while True:
            if not self._lanes:
                self._retry_wake.clear()
                await self._retry_wake.wait()
                delay = _FIRST_DELAY_S
            await asyncio.sleep(delay)
            progress = await self._retry_once()
            self._give_up_stuck()
            delay = _FIRST_DELAY_S if progress else min(delay * 2, _MAX_DELAY_S)

    async def _retry_once(self) -> bool:
        """One attempt at the head of every lane (together, within the batch limits); True
        when anything was settled."""
        taken, batch = self._lane_heads()
        if not batch:
            return False
        results = await self._attempt(batch)
        progress = False
        i = 0
        now = time.monotonic()
        for publisher, k in taken:
            items, outcome = batch[i : i + k], results[i : i + k]
            i += k
            progress = self._settle_lane(publisher, items, outcome, now) or progress
        return progress

    def _lane_heads(
        self,
    ) -> tuple[list[tuple[P | None, int]], list[tuple[P | None, int, RoutedMessage, int, Stamp]]]:
        """The next retry batch: the head of every lane, in lane order, within the batch
        limits; and (publisher, messages taken from its lane) for each lane in it."""
        taken: list[tuple[P | None, int]] = []
        batch: list[tuple[P | None, int, RoutedMessage, int, Stamp]] = []
        total = 0
        for publisher, lane in self._lanes.items():
            k = 0
            for item in lane:
                n = item[3]
                if batch and (total + n > _BATCH_BYTES or len(batch) >= MAX_BATCH):
                    break
                batch.append(item)
                total += n
                k += 1
            if k:
                taken.append((publisher, k))
            if k < len(lane):
                break  # the batch is full
        return taken, batch

    def _settle_lane(
        self,
        publisher: P | None,
        items: list[tuple[P | None, int, RoutedMessage, int, Stamp]],
        outcome: list[RouteResult],
        now: float,
    ) -> bool:
        """Release what the router settled of the `items` retried from the head of
        `publisher`'s lane (progress at `now`); the rest stays at its head. True when any
        was settled."""
        lane = self._lanes.get(publisher)
        if lane is None:  # given up meanwhile
            return False
        for _ in range(len(items)):  # the lane only grew at its end meanwhile
            lane.popleft()
        failed = []
        acked = []
        for item, result in zip(items, outcome, strict=True):
            if result in _DONE:
                self._on_done(item[0], item[1], result)
                if item[1]:
                    acked.append(item[4])
            else:
                failed.append(item)
        if acked and self._on_acked is not None:
            self._on_acked(acked)
        progress = len(failed) < len(items)
        if progress:
            self._since[publisher] = now
        lane.extendleft(reversed(failed))
        if not lane:
            del self._lanes[publisher], self._since[publisher]
        return progress

    def _give_up_stuck(self) -> None:
        now = time.monotonic()
        for publisher in [p for p, t in self._since.items() if now - t > self._give_up_s]:
            lane = self._lanes.pop(publisher)
            del self._since[publisher]
            log.error("router_gave_up", extra={"messages": len(lane)})
            for conn, _, _, _, _ in lane:
                self._on_give_up(conn)
