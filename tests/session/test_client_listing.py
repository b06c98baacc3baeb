"""The admin listing of connected clients (services/session/listing.py) on a real Redis: pages
by client id with the total, and a search by client id, user or address that finds what the
full scan finds (an oracle: `page_of` over every entry decoded), non-ASCII included."""

from __future__ import annotations

import dataclasses
import json
import uuid

from redis.asyncio import Redis

from services.session.listing import ClientListing, page_of
from services.session.registry import Holder, decode_holder
from services.session.registry_keys import clients_key


def _holders(tenant: str) -> list[Holder]:
    out = []
    for i in range(120):
        user = "Zoë" if i % 7 == 0 else f"user{i % 5}"
        out.append(
            Holder(tenant, f"dev-{i:03d}", "connection-0", i + 1, user, f"10.0.{i % 3}.{i}:5000")
        )
    return out


async def test_pages_and_search_match_a_full_scan(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    holders = _holders(tenant)
    await redis.hset(
        clients_key(tenant),
        mapping={h.client_id: json.dumps(dataclasses.asdict(h)) for h in holders},
    )
    listing = ClientListing(redis=redis, decode=decode_holder)
    try:
        first = await listing.page(tenant, query="", offset=0, limit=50)
        assert first.total == 120 and [h.client_id for h in first.holders][:2] == [
            "dev-000",
            "dev-001",
        ]
        last = await listing.page(tenant, query="", offset=100, limit=50)
        assert [h.client_id for h in last.holders] == [f"dev-{i}" for i in range(100, 120)]
        for query in ("USER3", "10.0.2.", "dev-01", "zoë", "connection", "nobody", '"'):
            got = await listing.page(tenant, query=query, offset=0, limit=0)
            assert got == page_of(holders, query=query, offset=0, limit=0), query
        assert (await listing.page(tenant, query="zoë", offset=0, limit=0)).total == 18
    finally:
        await redis.delete(clients_key(tenant))
        await redis.aclose()
