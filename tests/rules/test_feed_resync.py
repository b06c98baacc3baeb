"""A rule feed (services/rules/client.py `RuleFeed`, held by nodes, the router and the session
service) keeps a rule it heard of while a resync was under way, even when the snapshot that
resync gets predates the rule: a rules instance may answer the snapshot request on one NATS
connection and announce the new rule on another, so the announcement can arrive first."""

from __future__ import annotations

import asyncio
import uuid

import nats
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.rules.client import RuleFeed
from starling.rules.v1 import rules_pb2 as pb
from tests.poll import eventually


async def test_a_rule_announced_while_a_stale_snapshot_is_on_its_way_is_kept(
    nats_url: str,
) -> None:
    tenant = f"r{uuid.uuid4().hex[:6]}"
    answering = await nats.connect(nats_url)  # a rules instance's request/reply connection
    announcing = await nats.connect(nats_url)  # and the one its registry announces on
    asked = asyncio.Event()
    reply_to: list[str] = []

    async def snapshot_request(msg: Msg) -> None:
        reply_to.append(msg.reply)
        asked.set()

    await answering.subscribe(subjects.RULE_FILTERS_REQUEST, cb=snapshot_request)
    await flushed(answering)
    feed_nc = await nats.connect(nats_url)
    feed = RuleFeed(feed_nc)
    try:
        # It subscribes to the announcements, then asks for the snapshot.
        starting = asyncio.ensure_future(feed.start())
        await asyncio.wait_for(asked.wait(), 5)
        change = pb.TenantFilters(tenant=tenant, filters=["s/#"])
        await announcing.publish(subjects.RULE_FILTERS_CHANGED, change.SerializeToString())
        await flushed(announcing)
        await eventually(lambda: feed.wanted(tenant, "s/a"), 5, "the announcement heard")
        stale = pb.FilterSnapshot().SerializeToString()  # taken before the rule existed
        await answering.publish(reply_to[0], stale)  # and it arrives last
        await flushed(answering)
        await asyncio.wait_for(starting, 5)
        assert feed.wanted(tenant, "s/a"), "the stale snapshot undid the rule"
        assert not feed.wanted(tenant, "x/a")
    finally:
        await feed.stop()
        await feed_nc.close()
        await announcing.close()
        await answering.close()
