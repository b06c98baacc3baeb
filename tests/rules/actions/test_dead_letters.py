"""Contract of the dead-letter store, for every backend (Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from services.rules.actions.base import Output
from services.rules.actions.dead_letters import (
    DeadLetterLimits,
    DeadLetterStore,
    SqliteDeadLetters,
)
from tests.rules.actions.helpers import output

CASSANDRA = os.environ.get("STARLING_TEST_CASSANDRA", "")


def _open(kind: str, path: Path, limits: DeadLetterLimits) -> DeadLetterStore:
    if kind == "sqlite":
        return SqliteDeadLetters(path, limits)
    if not CASSANDRA:
        pytest.skip("Cassandra contract run needs STARLING_TEST_CASSANDRA=host:port")
    from services.rules.actions.dead_letters import CassandraDeadLetters

    host, _, port = CASSANDRA.partition(":")
    return CassandraDeadLetters(
        [host], int(port or 9042), keyspace="starling_test", consistency="ONE", limits=limits
    )


@pytest.fixture(params=["sqlite", "cassandra"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(backend: str, tmp_path: Path) -> AsyncIterator[DeadLetterStore]:
    s = _open(backend, tmp_path / "dl.db", DeadLetterLimits(max_count=5, max_bytes=100_000))
    yield s
    await s.close()


def _rule() -> str:
    return "r-" + uuid.uuid4().hex[:8]  # Cassandra's keyspace outlives a test


async def test_add_list_get_keep_the_outputs_whole(store: DeadLetterStore) -> None:
    rule = _rule()
    outs = [output(i, {"t": i, "raw": b"\x00\xff", "nested": {"a": [1, None]}}) for i in range(3)]
    assert await store.add("t1", rule, "hook", outs, "HTTP 503", 5) == 0
    letters = await store.list("t1", rule)
    assert [d.output for d in letters] == outs
    assert {(d.action, d.error, d.attempts) for d in letters} == {("hook", "HTTP 503", 5)}
    assert letters[0].id < letters[1].id < letters[2].id
    got = await store.get("t1", rule, [letters[2].id, letters[0].id])
    assert [d.output.message_id for d in got] == ["m0", "m2"]
    stats = await store.stats("t1", rule)
    assert stats.count == 3 and stats.bytes == sum(d.size for d in letters)


async def test_rules_and_tenants_are_apart(store: DeadLetterStore) -> None:
    rule = _rule()
    await store.add("t1", rule, "a", [output(1)], "x", 1)
    await store.add("t2", rule, "a", [output(2)], "x", 1)
    assert [d.output.message_id for d in await store.list("t1", rule)] == ["m1"]
    other = await store.list("t2", rule)
    assert await store.get("t1", rule, [other[0].id]) == []
    assert await store.delete("t1", rule, [other[0].id]) == 0
    assert await store.purge("t1", rule) == 1
    assert (await store.stats("t2", rule)).count == 1


async def test_pages_and_delete_and_purge(store: DeadLetterStore) -> None:
    rule = _rule()
    await store.add("t1", rule, "a", [output(i) for i in range(4)], "x", 1)
    first = await store.list("t1", rule, limit=2)
    rest = await store.list("t1", rule, after_id=first[-1].id, limit=10)
    assert [d.output.message_id for d in first + rest] == ["m0", "m1", "m2", "m3"]
    assert await store.delete("t1", rule, [first[0].id, first[0].id]) == 1
    assert (await store.stats("t1", rule)).count == 3
    assert await store.purge("t1", rule) == 3
    assert await store.list("t1", rule) == []
    assert (await store.stats("t1", rule)).count == 0


async def test_count_bound_drops_the_oldest(store: DeadLetterStore) -> None:
    rule = _rule()
    assert await store.add("t1", rule, "a", [output(i) for i in range(4)], "x", 1) == 0
    assert await store.add("t1", rule, "a", [output(i) for i in range(4, 8)], "x", 1) == 3
    left = await store.list("t1", rule)
    assert [d.output.message_id for d in left] == ["m3", "m4", "m5", "m6", "m7"]
    assert (await store.stats("t1", rule)).count == 5


async def test_byte_bound_drops_the_oldest_and_refuses_a_giant(
    backend: str, tmp_path: Path
) -> None:
    store = _open(backend, tmp_path / "b.db", DeadLetterLimits(max_count=1000, max_bytes=4096))
    try:
        rule = _rule()
        big = [output(i, {"blob": "x" * 1000}) for i in range(10)]
        await store.add("t1", rule, "a", big, "x", 1)
        stats = await store.stats("t1", rule)
        assert stats.bytes <= 4096 and 0 < stats.count < 10
        left = await store.list("t1", rule)
        assert left[-1].output.message_id == "m9"  # the newest stayed
        giant = output(99, {"blob": "y" * 10_000})
        assert await store.add("t1", rule, "a", [giant], "x", 1) == 1
        assert all(d.output.message_id != "m99" for d in await store.list("t1", rule))
    finally:
        await store.close()


async def test_letters_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    first = SqliteDeadLetters(path)
    await first.add("t1", "r1", "a", [output(1)], "boom", 2)
    await first.close()
    again = SqliteDeadLetters(path)
    try:
        [letter] = await again.list("t1", "r1")
        assert letter.output == output(1) and letter.error == "boom"
        assert (await again.stats("t1", "r1")).count == 1
    finally:
        await again.close()


async def test_replay_removes_only_what_was_accepted(store: DeadLetterStore) -> None:
    rule = _rule()
    await store.add("t1", rule, "good", [output(i) for i in range(2)], "x", 1)
    await store.add("t1", rule, "bad", [output(i) for i in range(2, 4)], "x", 1)
    seen: list[tuple[str, list[str]]] = []

    async def send(action: str, outs: Sequence[Output]) -> None:
        seen.append((action, [o.message_id for o in outs]))
        if action == "bad":
            raise ConnectionError("still down")

    result = await store.replay("t1", rule, [], send)
    assert (result.delivered, result.failed) == (2, 2)
    assert "still down" in result.errors[0]
    assert ("good", ["m0", "m1"]) in seen
    assert [d.action for d in await store.list("t1", rule)] == ["bad", "bad"]
    # Replay by id: only the named letter.
    [first, _] = await store.list("t1", rule)
    result = await store.replay("t1", rule, [first.id], send)
    assert (result.delivered, result.failed) == (0, 1)
