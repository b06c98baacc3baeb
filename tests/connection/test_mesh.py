"""Publishing into the mesh: per-subject batches in publish order, unique message ids."""

from __future__ import annotations

import asyncio

from services.connection.mesh import MAX_BATCH, MeshPublisher, MessageIds
from starling.common.v1.message_pb2 import RoutedBatch


class FakeNats:
    def __init__(self) -> None:
        self.published: list[tuple[str, list[str]]] = []
        self.flushes = 0

    async def publish(self, subject: str, data: bytes) -> None:
        batch = RoutedBatch.FromString(data)
        self.published.append((subject, [m.message_id for m in batch.messages]))

    async def flush(self, timeout: float) -> None:  # noqa: ASYNC109 - nats-py's signature
        self.flushes += 1


def test_consecutive_messages_to_one_subject_share_a_bounded_batch() -> None:
    mesh = MeshPublisher(FakeNats())  # type: ignore[arg-type]
    a = mesh.batch_for("s.a")
    assert mesh.batch_for("s.a") is a
    for i in range(MAX_BATCH):
        a.messages.add(message_id=str(i))
    full_next = mesh.batch_for("s.a")
    assert full_next is not a
    other = mesh.batch_for("s.b")
    assert other is not full_next
    assert mesh.batch_for("s.a") is not full_next  # a new run after another subject


async def test_batches_are_published_in_the_order_they_were_opened() -> None:
    nc = FakeNats()
    mesh = MeshPublisher(nc)  # type: ignore[arg-type]
    for i, subject in enumerate(["x", "x", "y", "x"]):
        mesh.batch_for(subject).messages.add(message_id=str(i))
    mesh.added(4)
    assert mesh.queued == 4
    task = asyncio.ensure_future(mesh.run())
    for _ in range(100):
        if mesh.queued == 0:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert nc.published == [("x", ["0", "1"]), ("y", ["2"]), ("x", ["3"])]
    assert mesh.queued == 0


def test_message_ids_never_repeat_across_restarts_of_a_node() -> None:
    first = MessageIds("node-0", 1_000)
    second = MessageIds("node-0", 2_000)  # the same node id, started again
    ids = [first.next() for _ in range(3)] + [second.next() for _ in range(3)]
    assert len(set(ids)) == 6
    assert MessageIds("node-1", 1_000).next() not in ids
