"""A node's leases of publish budgets (services/connection/quota.py) against a scripted quota
service with one-second windows, without I/O and on a hand-driven clock:

- far below a high limit the node asks once per window, not again and again;
- with the quota service down (`quota_unavailable=keep`), each node grants itself at most
  its fair share of the limit (the limit over the nodes the service counted), so the nodes
  together stay within the limit even when their last grants were uneven.
"""

from __future__ import annotations

import asyncio

from services.connection.budget import PublishGate
from services.connection.quota import NodeQuota
from services.quota.client import Lease, LeaseResult


class Clock:
    def __init__(self) -> None:
        self.now = 0.1

    def __call__(self) -> float:
        return self.now


class Service:
    """The quota service for one tenant's messages_per_s: `limit` per one-second window of
    the shared clock, first come first served, and the nodes that asked (as Redis counts
    them); other budgets are unlimited. `down`: every call fails."""

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit = limit
        self.clock = clock
        self.used: dict[int, int] = {}
        self.nodes: set[str] = set()
        self.down = False
        self.calls = 0

    async def acquire_lease(
        self, tenant: str, node_id: str, resource: str, amount: int, user: str = ""
    ) -> Lease:
        if self.down:
            raise ConnectionError("quota service down")
        self.calls += 1
        if resource != "messages_per_s":
            return Lease(LeaseResult.GRANTED, amount, 1000, 0)
        window = int(self.clock.now)
        granted = min(amount, self.limit - self.used.get(window, 0))
        self.used[window] = self.used.get(window, 0) + granted
        self.nodes.add(node_id)
        ttl_ms = round((window + 1 - self.clock.now) * 1000)
        result = LeaseResult.GRANTED if granted else LeaseResult.EXCEED_LIMIT
        return Lease(result, granted, ttl_ms, self.limit, len(self.nodes))

    async def close(self) -> None:
        pass


async def _settle() -> None:
    for _ in range(10):  # the lease tasks answer at once (no I/O): a few loop turns
        await asyncio.sleep(0)


async def _flood(gate: PublishGate, most: int = 1000) -> int:
    """Publish until the first refusal (leases answer between publishes): the number
    admitted."""
    for n in range(most):
        if not gate.admit(10):
            return n
        await _settle()
    return most


def _node(name: str, service: Service, clock: Clock) -> tuple[NodeQuota, PublishGate]:
    quota = NodeQuota(
        node_id=name,
        client=service,  # type: ignore[arg-type]
        on_refused=lambda r, t: None,
        unavailable="keep",
        clock=clock,
    )
    gate = quota.gate("t", "")
    assert gate is not None
    return quota, gate


async def test_far_below_a_high_limit_a_node_asks_once_per_window() -> None:
    clock = Clock()
    service = Service(100_000_000, clock)
    _quota, gate = _node("n1", service, clock)
    await _flood(gate, 50)  # the first window: the limit is learnt, then a sized ask
    for second in range(1, 4):
        clock.now = second + 0.1
        before = service.calls
        for _ in range(20):  # 20 bursts of 500 publishes over the window
            gate.begin()
            for _ in range(500):
                assert gate.admit(10)
            gate.end()
            await _settle()
            clock.now += 0.04
        # One ask for the messages budget (the bytes one is unlimited); it was three.
        assert service.calls - before == 1, service.calls - before


async def test_with_the_service_down_nodes_keep_at_most_their_fair_share() -> None:
    clock = Clock()
    service = Service(200, clock)
    _qa, a = _node("a", service, clock)
    _qb, b = _node("b", service, clock)
    for gate in (a, b):  # both learn the limit
        assert gate.admit(10)
        await _settle()
    # Uneven windows: a takes one, b the next (first come, first served; the loser gets
    # one publish on credit while its lease is under way, paid from its next grant).
    clock.now = 1.1
    assert await _flood(a) == 200
    assert await _flood(b) <= 1
    clock.now = 2.1
    assert await _flood(b) >= 199
    assert await _flood(a) <= 1
    # The service goes down: each node grants itself what it was last granted in a whole
    # window (about 200 each here: 400 together), but no more than 200 / 2 nodes.
    service.down = True
    for second in (3.1, 4.2, 5.3):
        clock.now = second
        got = await _flood(a), await _flood(b)
        assert all(95 <= n <= 100 for n in got) and sum(got) <= 200, (second, got)


async def test_a_tenant_never_answered_for_is_admitted_through_every_retry() -> None:
    """A node (re)started while the quota service cannot answer (its Redis is down) knows no
    limit for the tenant: `keep` admits its publishes, and still does after the retries
    that fail too (the second failed retry used to take the tenant for one limited to 0:
    every publish refused, PUBACK 0x97, on a tenant with no limits at all)."""
    clock = Clock()
    service = Service(200, clock)
    service.down = True
    _quota, gate = _node("n1", service, clock)
    for second in (0.1, 1.2, 2.3, 3.4, 4.5):
        clock.now = second
        assert await _flood(gate, 300) == 300, second
