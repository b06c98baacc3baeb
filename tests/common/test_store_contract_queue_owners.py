"""Contract of `QueueStore` for every backend (see test_store_contract): owners and concurrent
writers. A stale owner is fenced once a claim returned, writers racing on a queue never share
a seq, acks racing appends never move back, and a hand-over loses nothing."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from services.common.store.ports_queue import AppendOutcome, QueueStore
from tests.common import queue_stores
from tests.common.queue_stores import all_entries, items, named, second_store

queues = queue_stores.queues  # the fixture: every queue store


async def test_fencing_rejects_a_stale_owner(queues: QueueStore) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "c#1"
    old = await queues.claim_partition(9)
    new = await queues.claim_partition(9)
    assert new > old
    assert (await queues.append(t, q, items(1), 9, old, 0, True)).outcomes == [AppendOutcome.FENCED]
    assert (await queues.append(t, q, items(1), 9, new, 0, True)).outcomes == [AppendOutcome.OK]


class _StaleOwner:
    """An old owner that keeps appending to `names` (round robin) while another instance
    claims the partition: what it was told was stored (`ok`, per queue), what was stored
    although it started after the claim returned (`late`), and how many were fenced."""

    def __init__(self, queues: QueueStore, t: str, names: list[str], epoch: int) -> None:
        self.queues, self.t, self.names, self.epoch = queues, t, names, epoch
        self.ok: dict[str, list[str]] = {q: [] for q in names}
        self.late: list[str] = []
        self.fenced = 0
        self.claimed = asyncio.Event()
        self.writing = asyncio.Event()  # it has appended a few: the claim races them

    async def run(self) -> None:
        """Appends until it has tried a few after the claim returned (however fast or slow
        the claim is on this machine), at most 2,000."""
        after = 0
        for i in range(2000):
            q = self.names[i % len(self.names)]
            after_claim = self.claimed.is_set()  # read before the call: started after it
            item = named(1, i, "old-")
            res = await self.queues.append(self.t, q, item, 13, self.epoch, 0, True)
            if res.outcomes == [AppendOutcome.OK]:
                self.ok[q].append(item[0].message_id)
                if after_claim:
                    self.late.append(item[0].message_id)
            else:
                self.fenced += 1
            if i == 4:
                self.writing.set()
            after += after_claim
            if after >= 5:
                return
            await asyncio.sleep(0)


async def test_no_stale_append_lands_once_a_claim_returned(
    queues: QueueStore, tmp_path: Path
) -> None:
    """An old owner keeps appending to its queues while another instance claims the
    partition (on Cassandra, through a second connection): once the claim returned, every
    append of the old epoch is FENCED and changes nothing, and every append answered OK is
    in the queue, in order, with the counters matching."""
    second = second_store(queues, tmp_path)
    t = f"t{uuid.uuid4().hex[:6]}"
    names = [f"c{i}#1" for i in range(4)]
    stale = _StaleOwner(queues, t, names, await queues.claim_partition(13))
    for q in names[:2]:  # two queues the old owner already wrote to, two it has not yet
        await queues.append(t, q, named(1, 0, "pre-"), 13, stale.epoch, 0, True)
        stale.ok[q].append("pre-0")

    async def new_owner() -> int:
        await stale.writing.wait()
        epoch = await second.claim_partition(13)
        stale.claimed.set()
        return epoch

    try:
        _, new = await asyncio.gather(stale.run(), new_owner())
        assert stale.late == []  # nothing of the old epoch was taken after the claim returned
        # The race happened: the old owner wrote before the claim and was fenced after it.
        assert sum(len(v) for v in stale.ok.values()) > 2 and stale.fenced > 0
        for q in names:
            res = await second.append(t, q, named(1, 0, "new-"), 13, new, 0, True)
            assert res.outcomes == [AppendOutcome.OK]
            entries, st = await second.read(t, q, 1, 100)
            assert [e.seq for e in entries] == list(range(1, len(stale.ok[q]) + 2))
            assert st.last_seq == st.depth == len(stale.ok[q]) + 1
    finally:
        await second.close()


async def test_concurrent_appends_never_share_a_seq(queues: QueueStore) -> None:
    """Writers racing on one queue (the same owner's concurrent calls): every appended
    message is stored once, at its own seq, and the counters add up."""
    t, q = f"t{uuid.uuid4().hex[:6]}", "race#1"
    epoch = await queues.claim_partition(11)
    reports = await asyncio.gather(
        *(queues.append(t, q, named(5, 0, f"w{w}-"), 11, epoch, 0, True) for w in range(12))
    )
    assert all(r.outcomes == [AppendOutcome.OK] * 5 for r in reports)
    entries = await all_entries(queues, t, q)
    assert [e.seq for e in entries] == list(range(1, 61))
    assert len({e.data for e in entries}) == 60
    st = await queues.state(t, q)
    assert (st.last_seq, st.depth, st.acked_through) == (60, 60, 0)


async def test_acks_racing_appends_keep_depth_and_never_go_back(queues: QueueStore) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "race#2"
    epoch = await queues.claim_partition(12)
    await queues.append(t, q, items(40), 12, epoch, 0, True)
    await asyncio.gather(
        queues.ack(t, q, 30),
        queues.append(t, q, items(10, 40), 12, epoch, 0, True),
        queues.ack(t, q, 10),
        queues.append(t, q, items(10, 50), 12, epoch, 0, True),
        queues.ack(t, q, 20),
    )
    st = await queues.state(t, q)
    entries = await all_entries(queues, t, q)
    assert st.acked_through == 30  # the later, lower acks did not move it back
    assert st.last_seq == 60
    assert [e.seq for e in entries] == list(range(31, 61))
    assert st.depth == len(entries) == 30


async def test_a_new_owner_racing_the_old_one_loses_nothing(queues: QueueStore) -> None:
    """A hand-over mid-stream: whatever either owner was told was stored (OK) is stored,
    exactly once, each at its own seq; the old owner is fenced once the new one claimed."""
    t, q = f"t{uuid.uuid4().hex[:6]}", "race#3"
    old = await queues.claim_partition(13)

    async def new_owner() -> list[tuple[str, str]]:
        new = await queues.claim_partition(13)
        out = []
        for i in range(5):
            items = named(2, 2 * i, "new-")
            res = await queues.append(t, q, items, 13, new, 0, True)
            out += [(it.message_id, o) for it, o in zip(items, res.outcomes, strict=True)]
        return out

    async def old_owner(i: int) -> list[tuple[str, str]]:
        items = named(2, 2 * i, "old-")
        res = await queues.append(t, q, items, 13, old, 0, True)
        return [(it.message_id, o) for it, o in zip(items, res.outcomes, strict=True)]

    results = await asyncio.gather(*(old_owner(i) for i in range(5)), new_owner())
    outcomes = dict(pair for r in results for pair in r)
    assert all(outcomes[f"new-{i}"] == AppendOutcome.OK for i in range(10))
    entries = await all_entries(queues, t, q)
    stored = sorted(e.data.decode() for e in entries)
    ok = sorted(m for m, o in outcomes.items() if o == AppendOutcome.OK)
    assert stored == ok
    assert [e.seq for e in entries] == list(range(1, len(ok) + 1))
    fenced = await queues.append(t, q, items(1, 0, "late-"), 13, old, 0, True)
    assert fenced.outcomes == [AppendOutcome.FENCED]
