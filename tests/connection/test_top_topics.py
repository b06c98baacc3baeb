"""The top-topics summary: sampled, weighted, bounded, and busiest first."""

from __future__ import annotations

from services.common.message import Message
from services.connection.top_topics import SAMPLE_EVERY, TopTopics


def msgs(topic: str, n: int) -> list[Message]:
    return [Message("t", topic, b"", 0, False)] * n


def test_counts_are_sampled_and_weighted_across_batches() -> None:
    top = TopTopics()
    for _ in range(10):
        top.sample(msgs("a", 3))  # 30 in batches of 3: every 8th is looked at
    top.sample(msgs("b", 80))
    assert top.take() == [("b", 80), ("a", 4 * SAMPLE_EVERY)]
    assert top.take() == []  # taken: starts again


def test_memory_is_bounded_and_a_heavy_topic_survives_churn() -> None:
    top = TopTopics(capacity=4)
    for i in range(100):
        top.add("hot", 5)
        top.add(f"once/{i}", 1)
    taken = top.take(2)
    assert taken[0] == ("hot", 500)
    assert len(top._counts) == 0
    top2 = TopTopics(capacity=4)
    for i in range(50):
        top2.add(f"t{i}", 1)
    assert len(top2._counts) == 4
