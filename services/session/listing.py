"""A tenant's connected clients as an administrator pages through them (ListClients): the
search (client id, user or address, case-insensitive substring), the order (client id) and one
page of it, read from the registry's per-tenant hash (services/session/registry_keys.py
`clients_key`: client id -> entry) without decoding every entry: a page without a search reads
the client ids (HKEYS) and then only the page's entries (HMGET); a search decodes only the
entries whose raw text contains it. So 10,000 clients answer one page in milliseconds."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from redis.asyncio import Redis

from services.session.registry import Holder
from services.session.registry_keys import clients_key


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderPage:
    holders: tuple[Holder, ...]
    total: int  # how many matched the search


def matches(h: Holder, query: str) -> bool:
    q = query.strip().lower()
    return not q or any(q in v.lower() for v in (h.client_id, h.username, h.peer_address))


def page_of(holders: Iterable[Holder], *, query: str, offset: int, limit: int) -> HolderPage:
    """The matching holders by client id, `offset` skipped, at most `limit` (0: all)."""
    found = sorted((h for h in holders if matches(h, query)), key=lambda h: h.client_id)
    end = offset + limit if limit else len(found)
    return HolderPage(holders=tuple(found[offset:end]), total=len(found))


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientListing:
    """`decode`: an entry's raw JSON to its Holder (services/session/registry.py)."""

    redis: Redis
    decode: Callable[[bytes | str], Holder]

    async def page(self, tenant: str, *, query: str, offset: int, limit: int) -> HolderPage:
        key = clients_key(tenant)
        q = query.strip().lower()
        if not q:
            ids = sorted(_text(i) for i in await self.redis.hkeys(key))
            chosen = ids[offset : offset + limit] if limit else ids[offset:]
            raws: list[bytes | str | None] = await self.redis.hmget(key, chosen) if chosen else []
            found = tuple(self.decode(r) for r in raws if r)
            return HolderPage(holders=found, total=len(ids))
        values: list[bytes | str] = await self.redis.hvals(key)
        # The raw JSON holds every searched field; ASCII without quotes or backslashes is
        # written as is (json.dumps escapes the rest), so a raw miss is a miss.
        if q.isascii() and '"' not in q and "\\" not in q:
            values = [r for r in values if q in _text(r).lower()]
        return page_of((self.decode(r) for r in values), query=q, offset=offset, limit=limit)
