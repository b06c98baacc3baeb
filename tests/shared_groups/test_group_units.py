"""The pieces of durable shared groups without a mesh: the route table's group routes
(services/common/group_routes.py) and the queue owner's hand-out (services/queue/groups.py)
on a real SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.group_routes import group_queue_id, is_group_queue
from services.common.route_table import RouteTable, plan
from services.common.store.ports_queue import NewQueueItem, QueueChange
from services.common.store.ports_session import SubscriptionRecord
from services.common.store.sqlite_queue import SqliteQueueStore
from services.queue import groups
from services.queue.core import partition_of
from services.queue.groups import GroupDispatch
from starling.common.v1.message_pb2 import RoutedMessage

T = "t"


def _sub(client: str, filt: str, qos: int = 1) -> SubscriptionRecord:
    return SubscriptionRecord(T, client, 1, filt, qos)


def _queues(table: RouteTable, topic: str, qos: int = 1) -> list[str]:
    m = RoutedMessage(tenant=T, topic=topic, qos=qos, message_id="m")
    entries, _ = plan(table, [(0, m)], False).get(T, ([], []))
    return sorted(e.queue_id for e in entries)


def test_a_group_of_persistent_members_is_one_route_to_its_queue() -> None:
    table = RouteTable()
    table.add(_sub("a", "$share/g/s/+"))
    table.add(_sub("b", "$share/g/s/+", qos=2))
    table.add(_sub("c", "s/#"))
    qid = group_queue_id("g", "s/+")
    assert is_group_queue(qid) and not is_group_queue("a#1")
    assert _queues(table, "s/x") == sorted([qid, "c#1"])  # once for the group
    entries, _ = plan(table, [(0, RoutedMessage(tenant=T, topic="s/x", qos=2))], False)[T]
    assert {e.queue_id: e.qos for e in entries}[qid] == 2  # the members' highest QoS
    assert table.groups.members(T, "$share/g/s/+") == 2
    table.remove(T, "a", 1, "$share/g/s/+")
    assert _queues(table, "s/x") == sorted([qid, "c#1"])
    table.drop(T, "b", 1)  # the last member's session ends
    assert table.groups.members(T, "$share/g/s/+") == 0
    assert _queues(table, "s/x") == ["c#1"]


def test_a_copy_loaded_from_a_trie_has_the_group_routes() -> None:
    table = RouteTable()
    table.add(_sub("a", "$share/g/s/+"))
    trie = table.trie(T)
    assert trie is not None
    copy = RouteTable()
    copy.adopt(T, trie, lambda: {})
    assert _queues(copy, "s/y") == [group_queue_id("g", "s/+")]


class _Parts:
    """The owner's partitions as GroupDispatch reads them."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.epochs: dict[int, int] = {}


@pytest.fixture
async def setup(tmp_path: Path) -> Any:
    store = SqliteQueueStore(tmp_path / "q.db")
    parts = _Parts(8)
    qid = group_queue_id("g", "s/+")
    p = partition_of(T, qid, parts.count)
    parts.epochs[p] = await store.claim_partition(p)
    items = [NewQueueItem(f"m{i}", 1, b"") for i in range(1, 11)]
    await store.append(T, qid, items, p, parts.epochs[p], 0, False)
    announced: list[tuple[str, str]] = []

    async def counted(tenant: str, queue_id: str, write: Any) -> None:
        change: QueueChange = await write
        assert change.depth <= 0

    async def announce(tenant: str, queue_id: str, dropped: bool = False) -> None:
        announced.append((tenant, queue_id))

    def dispatch() -> GroupDispatch:
        return GroupDispatch(store=store, parts=parts, counted=counted, announce=announce)  # type: ignore[arg-type]

    yield store, parts, qid, dispatch, announced
    await store.close()


async def test_members_claim_apart_and_the_queue_follows_their_acks(setup: Any) -> None:
    store, _, qid, dispatch, announced = setup
    d = dispatch()
    a = await d.claim(T, qid, "A", 4)
    b = await d.claim(T, qid, "B", 4)
    assert [e.seq for e in a.entries] == [1, 2, 3, 4] and a.delivered_through == 0
    assert [e.seq for e in b.entries] == [5, 6, 7, 8]
    assert await d.done(T, qid, "B", [5, 6])
    assert (await store.state(T, qid)).acked_through == 0  # 1-4 are not done yet
    await d.done(T, qid, "A", [1, 2, 3, 4])
    assert (await store.state(T, qid)).acked_through == 6
    # B leaves with 7 and 8: they go first to the next member that claims, as resends.
    await d.detach(T, qid, "B")
    assert announced == [(T, qid)]
    c = await d.claim(T, qid, "C", 3)
    assert [e.seq for e in c.entries] == [7, 8, 9] and c.delivered_through == 8


async def test_a_new_owner_starts_from_acked_through(setup: Any) -> None:
    store, _, qid, dispatch, _ = setup
    old = dispatch()
    await old.claim(T, qid, "A", 5)
    await old.done(T, qid, "A", [1, 2, 4])
    new = dispatch()  # the old owner died: its claims are gone with it
    got = await new.claim(T, qid, "B", 10)
    assert [e.seq for e in got.entries] == [3, 4, 5, 6, 7, 8, 9, 10]  # 4 again: at least once
    await new.done(T, qid, "A", [3])  # a late ack from the old hand-out still counts
    assert (await store.state(T, qid)).acked_through == 3


async def test_only_the_owner_hands_out_and_acknowledges(setup: Any) -> None:
    _, parts, qid, dispatch, _ = setup
    d = dispatch()
    parts.epochs.clear()
    assert (await d.claim(T, qid, "A", 5)).entries == []
    assert not await d.done(T, qid, "A", [1])


async def test_a_silent_members_claims_go_back(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, qid, dispatch, announced = setup
    d = dispatch()
    await d.claim(T, qid, "A", 3)
    monkeypatch.setattr(groups, "MEMBER_TTL_S", -1.0)  # A has been silent too long
    got = await d.claim(T, qid, "B", 3)
    assert [e.seq for e in got.entries] == [1, 2, 3] and announced
