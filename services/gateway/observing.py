"""Observations: what CoAP observers read from the mesh. Each observed (tenant, filter) is
one set of NATS subscriptions on the filter's subjects (services/common/topics/subject.py,
the subjects a node subscribes for the same filter), shared by every observer of it; the
messages come as a node's do, `RoutedBatch`es, and each goes to the observers of the filter
that matched it, so an observer gets a message once however its filter maps to subjects.

An observer is a bounded queue (`Observer.queue`): the CoAP side sends from it one
notification per message. When an observer falls `queue_max` messages behind, new messages
for it are dropped and counted (as a node drops for a slow MQTT subscriber), not held.
The tenant's interest is announced to the nodes (interest.py) before the first observer of
the tenant is confirmed, so no message published after the confirmation is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.common.bus.large import Fetcher
from services.common.topics import filter_to_subjects
from services.gateway.interest import MeshPresence
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

log = logging.getLogger("starling.gateway.observing")


@dataclass(eq=False)
class Observer:
    tenant: str
    filter: str
    qos: int  # the most a notification is sent at (min with the message's QoS)
    queue: asyncio.Queue[RoutedMessage | None]  # None: the observation is over
    dropped: int = 0
    closed: bool = False

    def close(self) -> None:
        """End the observation from this side (its client went): the reader gets None."""
        if self.closed:
            return
        self.closed = True
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


@dataclass
class _Watch:
    subs: list[Subscription]
    observers: set[Observer] = field(default_factory=set)


class Observations:
    def __init__(self, *, nc: Client, interest: MeshPresence, queue_max: int = 256) -> None:
        self._nc = nc
        self._fetcher = Fetcher(nc)
        self._interest = interest
        self._queue_max = queue_max
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}

    def __len__(self) -> int:
        return sum(len(w.observers) for w in self._watches.values())

    async def observe(self, tenant: str, filt: str, qos: int) -> Observer:
        """A new observer of `filt` in `tenant` (the filter already checked); returns once
        messages published from now on reach it."""
        key = (tenant, filt)
        obs = Observer(tenant, filt, qos, asyncio.Queue(self._queue_max))
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            watch = self._watches.get(key)
            if watch is None:
                subs = [
                    await self._nc.subscribe(subject, cb=self._deliverer(key))
                    for subject in filter_to_subjects(tenant, filt)
                ]
                watch = self._watches[key] = _Watch(subs)
                await self._nc.flush(5)
            watch.observers.add(obs)
        await self._interest.hold(tenant)
        return obs

    async def forget(self, obs: Observer) -> None:
        """The observer is gone (cancelled, its client kicked or unregistered)."""
        key = (obs.tenant, obs.filter)
        watch = self._watches.get(key)
        if watch is None or obs not in watch.observers:
            return
        watch.observers.discard(obs)
        self._interest.release(obs.tenant)
        if watch.observers:
            return
        del self._watches[key]
        self._starting.pop(key, None)
        for sub in watch.subs:
            try:
                await sub.unsubscribe()
            except Exception:
                log.debug("unsubscribe_failed")

    def _deliverer(self, key: tuple[str, str]):  # type: ignore[no-untyped-def]
        async def deliver(msg: Msg) -> None:
            watch = self._watches.get(key)
            if watch is None:
                return
            data = await self._fetcher.resolve(msg)  # a large payload comes by reference
            if data is None:
                return
            try:
                batch = RoutedBatch.FromString(data)
            except Exception:
                log.warning("batch_malformed", extra={"subject": msg.subject})
                return
            for env in batch.messages:
                for obs in watch.observers:
                    if obs.closed:
                        continue
                    try:
                        obs.queue.put_nowait(env)
                    except asyncio.QueueFull:
                        obs.dropped += 1

        return deliver
