"""What a connection node uses of the rules service: which topics of which tenants the rules
read (`RuleFeed.wanted`), and the RULES stream those messages go to (`RuleFeed.store` waits
for the stream's acknowledgement, `RuleFeed.offer` does not); each tenant's auto-subscriptions
(`RuleFeed.auto_subscriptions`) and the client events its rules read that the node emits
(`RuleFeed.emits`).

Theory of operation: the filters come as a snapshot of every tenant at start (request on
`svc.rules.filters`, answered by any rules instance), then as one tenant's full set after each
change (`ctl.rules.filters`), and again as a snapshot every `resync_s` (a push lost while the
node was disconnected, or two changes racing, heal there). A message is stored with its
message id as `Nats-Msg-Id`: a node retrying a batch after a lost answer does not store it
twice (the stream's duplicate window). A full stream refuses new messages (it never drops
stored ones): `store_outcomes` says FULL for those, which the node answers with 0x97."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from enum import IntEnum

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from services.common.bus import subjects
from services.common.topics.autosub import AutoSubscription
from services.common.topics.trie import TopicTrie
from starling.common.v1.message_pb2 import RoutedMessage
from starling.rules.v1 import rules_pb2 as pb

log = logging.getLogger("starling.rules.client")

# JetStream's "store failed" API error; with DiscardPolicy.NEW a full stream answers it with
# "maximum bytes exceeded" (or messages).
_JS_STORE_FAILED = 10077


class StoreOutcome(IntEnum):
    """What the RULES stream did with one message."""

    STORED = 1  # acknowledged (or a duplicate of a stored one)
    FULL = 2  # refused: the stream is at its limit (the rules service is behind or down)
    FAILED = 3  # no answer, no stream, another error: try again with the same message id


class RuleFeed:
    def __init__(self, nc: Client, resync_s: float = 30.0, ack_timeout_s: float = 5.0) -> None:
        self._nc = nc
        self._ack_timeout_s = ack_timeout_s
        self._jetstream: JetStreamContext | None = None  # made at first use (`_js`)
        self._resync_s = resync_s
        self._tries: dict[str, TopicTrie[str, None]] = {}
        self._autosubs: dict[str, tuple[AutoSubscription, ...]] = {}
        self._events: dict[str, frozenset[str]] = {}
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[object]] = set()
        self._full = False  # the stream's last answer was "full" (logged once per episode)
        # Change notices heard while a resync waits for its snapshot, one list per resync:
        # the snapshot may predate them (the notice can overtake the reply), so they are
        # applied again on top of it.
        self._heard: list[list[pb.TenantFilters]] = []

    @property
    def _js(self) -> JetStreamContext:
        """The stream's context, made at first use: the feed may be built before its NATS
        client connects (services/common/bus/client.py LateClient)."""
        if self._jetstream is None:
            self._jetstream = self._nc.jetstream(timeout=self._ack_timeout_s)
        return self._jetstream

    # ---- filters ------------------------------------------------------------------------

    def wanted(self, tenant: str, topic: str) -> bool:
        """Whether any rule of `tenant` reads `topic`."""
        trie = self._tries.get(tenant)
        return trie is not None and bool(trie.match(topic))

    def reads_any(self) -> bool:
        """Whether a rule of any tenant reads messages."""
        return bool(self._tries)

    def filters_of(self, tenant: str) -> TopicTrie[str, None] | None:
        """The trie of `tenant`'s rule filters; None: no rule reads its messages (looked up
        once per batch of a tenant's messages, not once per message)."""
        return self._tries.get(tenant)

    def auto_subscriptions(self, tenant: str) -> tuple[AutoSubscription, ...]:
        """`tenant`'s auto-subscription templates (services/common/topics/autosub.py)."""
        return self._autosubs.get(tenant, ())

    def emits(self, tenant: str, kind: str) -> bool:
        """Whether a rule of `tenant` reads the client event `kind` the node emits."""
        kinds = self._events.get(tenant)
        return kinds is not None and kind in kinds

    def set_tenant(self, t: pb.TenantFilters) -> None:
        """One tenant's full state, as the rules service pushes or snapshots it."""
        self.set_filters(t.tenant, t.filters)
        if t.auto_subscriptions:
            self._autosubs[t.tenant] = tuple(
                AutoSubscription(a.filter, a.qos) for a in t.auto_subscriptions
            )
        else:
            self._autosubs.pop(t.tenant, None)
        if t.events:
            self._events[t.tenant] = frozenset(t.events)
        else:
            self._events.pop(t.tenant, None)

    def set_filters(self, tenant: str, filters: Sequence[str]) -> None:
        if not filters:
            self._tries.pop(tenant, None)
            return
        trie: TopicTrie[str, None] = TopicTrie()
        for f in filters:
            trie.add(f, f, None)
        self._tries[tenant] = trie

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(subjects.RULE_FILTERS_CHANGED, cb=self._on_change)
        await self.resync()
        self._task = asyncio.create_task(self._resync_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the NATS connection is already closed (a lost bus)
                log.debug("rule_filters_unsubscribe_failed")

    async def resync(self) -> bool:
        """Replace every tenant's filters with a rules instance's snapshot, then apply again
        the change notices heard while waiting for it (the notice of a rule created after
        the snapshot was taken can be handled before the reply: it must not be undone);
        False when none answered (no rules service: the node keeps what it had)."""
        heard: list[pb.TenantFilters] = []
        self._heard.append(heard)
        try:
            reply = await self._nc.request(subjects.RULE_FILTERS_REQUEST, b"", timeout=2.0)
        except Exception as exc:  # no rules instance running, or slow: try again later
            log.info("rule_filters_unavailable", extra={"error": type(exc).__name__})
            return False
        finally:
            self._heard.remove(heard)
        snap = pb.FilterSnapshot.FromString(reply.data)
        self._tries, self._autosubs, self._events = {}, {}, {}
        for t in (*snap.tenants, *heard):
            self.set_tenant(t)
        return True

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._resync_s)
            await self.resync()

    async def _on_change(self, msg: Msg) -> None:
        t = pb.TenantFilters.FromString(msg.data)
        for heard in self._heard:
            heard.append(t)
        self.set_tenant(t)

    # ---- the stream ---------------------------------------------------------------------

    async def store(self, envs: Sequence[RoutedMessage]) -> list[bool]:
        """Store each message in the RULES stream; True where the stream acknowledged it."""
        return [o is StoreOutcome.STORED for o in await self.store_outcomes(envs)]

    async def store_outcomes(self, envs: Sequence[RoutedMessage]) -> list[StoreOutcome]:
        """Store each message in the RULES stream; what the stream did with each."""
        results = await asyncio.gather(*(self._store_one(e) for e in envs))
        return list(results)

    async def _store_one(self, env: RoutedMessage) -> StoreOutcome:
        try:
            await self._js.publish(
                subjects.rules_stream(env.tenant),
                env.SerializeToString(),
                headers={"Nats-Msg-Id": env.message_id} if env.message_id else None,
            )
            if self._full:
                self._full = False
                log.info("rules_stream_accepting")
            return StoreOutcome.STORED
        except NoStreamResponseError:
            log.warning("rules_stream_missing")
            return StoreOutcome.FAILED
        except APIError as exc:
            if exc.err_code == _JS_STORE_FAILED and "exceeded" in (exc.description or ""):
                if not self._full:  # the publishers are told (0x97); the operator once
                    self._full = True
                    log.warning("rules_stream_full", extra={"tenant": env.tenant})
                return StoreOutcome.FULL
            log.warning("rules_stream_store_failed", extra={"error": type(exc).__name__})
            return StoreOutcome.FAILED
        except Exception as exc:
            log.warning("rules_stream_store_failed", extra={"error": type(exc).__name__})
            return StoreOutcome.FAILED

    def offer(self, env: RoutedMessage) -> None:
        """A QoS 0 message: into the stream without waiting for its acknowledgement."""
        task = asyncio.ensure_future(
            self._nc.publish(subjects.rules_stream(env.tenant), env.SerializeToString())
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
