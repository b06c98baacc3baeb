"""Micro-benchmarks of the hot paths: PUBLISH decode/encode, trie match, fan-out delivery."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from services.common.connect import ConnectOutcome
from services.common.message import Message
from services.common.mqtt import Connect, Decoder, Publish, encode, encode_publish
from services.common.topics import TopicTrie
from services.connection.channel import Channel, ChannelConfig


def rate(fn: Callable[[], int], seconds: float = 1.5) -> float:
    """Operations per second of `fn` (which returns how many operations it did)."""
    fn()  # warm up
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


def publish_packet() -> Publish:
    return Publish("t" * 32, b"x" * 64, 1, False, False, 1234)


def bench_decode() -> float:
    raw = encode_publish(publish_packet(), 4) * 1000
    dec = Decoder(4)
    return rate(lambda: len(dec.feed(raw)))


def bench_encode() -> float:
    p = publish_packet()

    def run() -> int:
        for _ in range(1000):
            encode_publish(p, 4)
        return 1000

    return rate(run)


def build_trie(
    n: int = 100_000, wildcard_share: float = 0.1
) -> tuple[TopicTrie[int, int], list[str]]:
    rnd = random.Random(7)
    trie: TopicTrie[int, int] = TopicTrie()
    topics = []
    for i in range(n):
        levels = [
            f"site{rnd.randrange(100)}",
            f"dev{rnd.randrange(1000)}",
            rnd.choice(["temp", "hum", "power", "state"]),
        ]
        topics.append("/".join(levels))
        if rnd.random() < wildcard_share:
            if rnd.random() < 0.5:
                levels[1] = "+"
            else:
                levels = [*levels[:2], "#"]
        trie.add("/".join(levels), i, i)
    return trie, topics


def bench_trie(trie: TopicTrie[int, int], topics: list[str]) -> float:
    sample = topics[:10_000]

    def run() -> int:
        for t in sample:
            trie.match(t)
        return len(sample)

    return rate(run)


def bench_fanout_delivery() -> float:
    """Channel.deliver + encode for QoS 0 to a 3.1.1 client: the per-subscriber cost."""
    ch = Channel(ChannelConfig(), "p", 0.0, lambda: "auto-bench")
    ch.receive(encode(Connect("c", 4), 4), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    msg = Message("t", "t" * 32, b"x" * 64, 0, False)

    def run() -> int:
        for _ in range(1000):
            ch.deliver(msg, 0, False, (), 1.0)
        ch.out.clear()
        return 1000

    return rate(run)


def run_all() -> dict[str, float]:
    trie, topics = build_trie()
    return {
        "PUBLISH decode (QoS 1, 32 B topic, 64 B payload)": bench_decode(),
        "PUBLISH encode (same packet)": bench_encode(),
        "trie match, 100,000 filters, 10% wildcards": bench_trie(trie, topics),
        "fan-out: deliver + encode to one QoS 0 subscriber": bench_fanout_delivery(),
    }


if __name__ == "__main__":
    for name, value in run_all().items():
        print(f"{name:<55} {value:>12,.0f} /s")
