"""LimitsCopies (services/quota/copies.py): answers at once, keeps the last answer when the
quota service fails, asks again after a failure and on an announced change."""

from __future__ import annotations

import asyncio

from services.quota.client import Limits
from services.quota.copies import RETRY_S, LimitsCopies


class FakeQuota:
    def __init__(self) -> None:
        self.limits = Limits(max_queue_depth=5)
        self.fail = False
        self.calls = 0

    async def get_limits(self, tenant: str, user: str = "") -> Limits:
        self.calls += 1
        if self.fail:
            raise ConnectionError("down")
        return self.limits

    async def close(self) -> None:
        pass


class Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


def test_copies_answer_at_once_keep_the_last_answer_and_follow_changes() -> None:
    async def go() -> None:
        now = [0.0]
        quota = FakeQuota()
        copies = LimitsCopies(quota, clock=lambda: now[0])  # type: ignore[arg-type]
        first = copies.get("acme")
        assert not first.known and first.limits == Limits()  # no limits until answered
        assert (await copies.fetch("acme")).limits.max_queue_depth == 5
        assert copies.get("acme") is first and first.known  # one object, updated in place
        quota.limits = Limits(max_queue_depth=7)
        await copies._on_change(Msg(b"acme"))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert first.limits.max_queue_depth == 7
        quota.fail = True
        await copies._on_change(Msg(b"acme"))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert first.limits.max_queue_depth == 7  # the service down: the last answer holds
        other = await copies.fetch("other")
        assert not other.known and other.limits == Limits()  # never answered: no limits
        calls = quota.calls
        copies.get("other")
        await asyncio.sleep(0.01)
        assert quota.calls == calls  # not before RETRY_S
        quota.fail = False
        now[0] += RETRY_S
        assert (await copies.fetch("other")).limits.max_queue_depth == 7
        await copies.stop()

    asyncio.run(go())
