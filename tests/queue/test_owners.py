"""The callers' ownership map (services/queue/owners.py): the highest epoch names a
partition's owner whatever order announcements arrive in; released partitions are forgotten."""

from __future__ import annotations

from services.queue.core import partition_of
from services.queue.owners import Owner, OwnerMap
from starling.queue.v1 import queue_pb2 as pb


def ann(
    instance: str, owned: dict[int, int], count: int = 4, leaving: bool = False
) -> pb.QueueOwners:
    return pb.QueueOwners(
        instance_id=instance,
        partition_count=count,
        partitions=list(owned),
        epochs=list(owned.values()),
        grpc_address=f"{instance}:1",
        leaving=leaving,
    )


def owner_of_partition(m: OwnerMap, p: int) -> str | None:
    qid = next(f"q{i}" for i in range(1000) if partition_of("t", f"q{i}", 4) == p)
    o = m.owner("t", qid)
    return None if o is None else o.instance_id


def test_one_instance_owns_everything() -> None:
    m = OwnerMap()
    assert m.owner("t", "q") is None and not m.complete()
    assert m.learn(ann("a", {0: 1, 1: 1, 2: 1, 3: 1}))
    assert m.sole == Owner("a", "a:1") and m.complete()
    assert not m.learn(ann("a", {0: 1, 1: 1, 2: 1, 3: 1}))  # the periodic repeat


def test_a_later_claim_wins_whatever_the_order_of_announcements() -> None:
    m = OwnerMap()
    m.learn(ann("a", {0: 1, 1: 1, 2: 1, 3: 1}))
    m.learn(ann("b", {2: 2, 3: 2}))  # b took 2 and 3 over (a died)
    assert m.sole is None
    assert [owner_of_partition(m, p) for p in range(4)] == ["a", "a", "b", "b"]
    m.learn(ann("a", {0: 1, 1: 1, 2: 1, 3: 1}))  # a's last word, arriving late
    assert [owner_of_partition(m, p) for p in range(4)] == ["a", "a", "b", "b"]
    assert m.owner_ids() == {"a", "b"}


def test_released_and_leaving_partitions_are_forgotten() -> None:
    m = OwnerMap()
    m.learn(ann("a", {0: 1, 1: 1, 2: 1, 3: 1}))
    assert m.learn(ann("a", {0: 1, 1: 1}))  # a gave 2 and 3 up (b joined)
    assert owner_of_partition(m, 2) is None and not m.complete()
    m.learn(ann("b", {2: 2, 3: 2}))
    assert m.complete() and m.owner_ids() == {"a", "b"}
    assert m.learn(ann("a", {}, leaving=True))
    assert m.owner_ids() == {"b"} and owner_of_partition(m, 0) is None
