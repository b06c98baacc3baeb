"""Publishing into the mesh: per-subject batches in publish order."""

from __future__ import annotations

import asyncio

from services.common.bus.large import HEADROOM, REF_HEADER, Holder
from services.common.rpc.limits import BATCH_BYTES
from services.connection.mesh import MAX_BATCH, MeshPublisher, pieces
from starling.common.v1.message_pb2 import RoutedBatch
from tests.poll import eventually


class FakeNats:
    def __init__(self, max_payload: int = 1 << 20) -> None:
        self.published: list[tuple[str, list[str]]] = []
        self.sizes: list[int] = []
        self.refs: list[str] = []
        self.flushes = 0
        self.max_payload = max_payload

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        assert len(data) <= self.max_payload  # what the server would refuse
        if headers and REF_HEADER in headers:
            self.refs.append(headers[REF_HEADER])
            self.published.append((subject, ["ref"]))
            return
        batch = RoutedBatch.FromString(data)
        self.sizes.append(len(data))
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
    await eventually(lambda: mesh.queued == 0, 5, "the queue sent", every_s=0.01)
    task.cancel()
    assert nc.published == [("x", ["0", "1"]), ("y", ["2"]), ("x", ["3"])]
    assert mesh.queued == 0


def test_batches_close_at_the_byte_budget() -> None:
    mesh = MeshPublisher(FakeNats())  # type: ignore[arg-type]
    a = mesh.batch_for("s.a", BATCH_BYTES // 2)
    assert mesh.batch_for("s.a", BATCH_BYTES // 2) is a
    b = mesh.batch_for("s.a", 1)
    assert b is not a  # full by bytes, long before MAX_BATCH messages
    big = mesh.batch_for("s.a", 5 * BATCH_BYTES)
    assert big is not b  # a message over the budget starts its own batch
    assert mesh.batch_for("s.a", 1) is not big


def test_pieces_cut_a_batch_below_the_limit_in_order() -> None:
    batch = RoutedBatch()
    for i in range(10):
        batch.messages.add(message_id=str(i), payload=bytes(300 if i != 4 else 5000))
    out = [RoutedBatch.FromString(d) for d in pieces(batch, 1000)]
    assert [m.message_id for b in out for m in b.messages] == [str(i) for i in range(10)]
    assert all(b.ByteSize() <= 1000 or len(b.messages) == 1 for b in out)
    assert [len(b.messages) for b in out if b.ByteSize() > 1000] == [1]


async def test_a_message_larger_than_nats_takes_a_reference_in_its_place() -> None:
    """Order on the subject is kept: small, reference, small; every NATS message fits."""
    nc = FakeNats(max_payload=256 << 10)
    holder = Holder("node-a", max_bytes=10 << 20)
    mesh = MeshPublisher(nc, holder)  # type: ignore[arg-type]
    for i, size in enumerate([10, 1 << 20, 10]):
        mesh.batch_for("x", size).messages.add(message_id=str(i), payload=bytes(size))
    mesh.added(3)
    task = asyncio.ensure_future(mesh.run())
    await eventually(lambda: mesh.queued == 0, 5, "the queue sent", every_s=0.01)
    task.cancel()
    assert nc.published == [("x", ["0"]), ("x", ["ref"]), ("x", ["2"])]
    subject, _, size = nc.refs[0].split()
    assert subject == "mqf.node-a" and int(size) > 1 << 20
    assert holder.held_bytes == int(size)
    assert max(nc.sizes) <= (256 << 10) - HEADROOM
