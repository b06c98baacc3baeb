"""The fault suite's ledger: every publish handed to a client, every PUBACK/PUBCOMP it got,
every delivery a subscriber got; `verdict()` says what was lost, doubled or reordered.

A payload carries its publisher and sequence number (`payload(publisher, seq)`), so a
delivery names the publish it stems from whatever path it took. Callbacks come from client
threads: one lock guards the ledger.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field


def payload(publisher: str, seq: int, size: int = 0) -> bytes:
    """`publisher:seq:` padded with dots to `size` bytes (when larger)."""
    head = f"{publisher}:{seq}:".encode()
    return head + b"." * max(0, size - len(head))


def parse(data: bytes) -> tuple[str, int]:
    publisher, seq, _ = data.split(b":", 2)
    return publisher.decode(), int(seq)


@dataclass
class SubscriberVerdict:
    persistent: bool
    delivered: int  # distinct publishes received
    deliveries: int  # every PUBLISH received, repeats included
    lost: list[tuple[str, int]]  # acknowledged to their publisher, never delivered here
    qos1_duplicates: int  # repeats of QoS 1 deliveries (allowed: at least once)
    qos2_duplicates: list[tuple[str, int]]  # repeats of QoS 2 deliveries (never allowed)
    order_violations: list[tuple[str, int, int]]  # (publisher, seq, after seq) first arrivals


@dataclass
class Verdict:
    sent: int
    acked: int
    subscribers: dict[str, SubscriberVerdict] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return sum(len(s.lost) for s in self.subscribers.values() if s.persistent)

    @property
    def clean_lost(self) -> int:
        """Acknowledged publishes a clean-session subscriber never got (while connected)."""
        return sum(len(s.lost) for s in self.subscribers.values() if not s.persistent)

    @property
    def qos2_duplicates(self) -> int:
        return sum(len(s.qos2_duplicates) for s in self.subscribers.values())

    @property
    def qos1_duplicates(self) -> int:
        return sum(s.qos1_duplicates for s in self.subscribers.values())

    @property
    def order_violations(self) -> int:
        return sum(len(s.order_violations) for s in self.subscribers.values() if s.persistent)

    @property
    def delivered(self) -> int:
        return sum(s.delivered for s in self.subscribers.values())

    def summary(self) -> dict[str, object]:
        """Figures for docs/failure-behaviour.md (lists cut to their first few entries)."""
        subs = {}
        for name, s in self.subscribers.items():
            d = asdict(s)
            for key in ("lost", "qos2_duplicates", "order_violations"):
                d[key] = len(getattr(s, key))
            subs[name] = d
        return {
            "sent": self.sent,
            "acked": self.acked,
            "delivered": self.delivered,
            "lost": self.lost,
            "clean_lost": self.clean_lost,
            "qos1_duplicates": self.qos1_duplicates,
            "qos2_duplicates": self.qos2_duplicates,
            "order_violations": self.order_violations,
            "subscribers": subs,
        }

    def check(self, clean_may_lose: bool = False) -> None:
        """The suite's promise: nothing acknowledged is lost to a persistent session, no QoS 2
        publish arrives twice anywhere, and a persistent session gets each publisher's
        messages in order (first arrivals; QoS 1 repeats are allowed). A clean session loses
        nothing either unless `clean_may_lose` (the fault is in the transient path)."""
        problems = []
        for name, s in self.subscribers.items():
            if (s.persistent or not clean_may_lose) and s.lost:
                problems.append(f"{name} lost {len(s.lost)} acknowledged: {s.lost[:10]}")
            if s.qos2_duplicates:
                problems.append(f"{name} got QoS 2 twice: {s.qos2_duplicates[:10]}")
            if s.persistent and s.order_violations:
                problems.append(f"{name} out of order: {s.order_violations[:10]}")
        assert not problems, "; ".join(problems) + f" ({self.summary()})"


class Checker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._qos: dict[str, int] = {}  # the publishers' QoS
        self._sent: dict[str, int] = defaultdict(int)
        self._acked: dict[str, set[int]] = defaultdict(set)
        self._persistent: dict[str, bool] = {}
        # Per subscriber: every arrival in order, as (publisher, seq).
        self._arrivals: dict[str, list[tuple[str, int]]] = {}
        self._q2: dict[str, set[tuple[str, int]]] = defaultdict(set)  # delivered at QoS 2

    def publisher(self, name: str, qos: int) -> None:
        with self._lock:
            self._qos[name] = qos

    def subscriber(self, name: str, persistent: bool) -> None:
        with self._lock:
            self._persistent[name] = persistent
            self._arrivals[name] = []

    def sent(self, publisher: str, seq: int) -> None:
        with self._lock:
            self._sent[publisher] = max(self._sent[publisher], seq + 1)

    def acked(self, publisher: str, seq: int) -> None:
        """The publisher got PUBACK (QoS 1) or PUBCOMP (QoS 2) for `seq`."""
        with self._lock:
            self._acked[publisher].add(seq)

    def delivered(self, subscriber: str, data: bytes, qos: int) -> None:
        """`subscriber` got a PUBLISH carrying `data` at `qos` (the delivery's QoS: exactly
        once applies to what is delivered at QoS 2)."""
        who = parse(data)
        with self._lock:
            self._arrivals[subscriber].append(who)
            if qos == 2:
                self._q2[subscriber].add(who)

    def acked_count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._acked.values())

    def acknowledged(self) -> set[tuple[str, int]]:
        """Every acknowledged publish, as (publisher, seq)."""
        with self._lock:
            return {(p, s) for p, seqs in self._acked.items() for s in seqs}

    def acked_by(self, publisher: str) -> int:
        """How many of one publisher's messages were acknowledged."""
        with self._lock:
            return len(self._acked[publisher])

    def sent_count(self) -> int:
        with self._lock:
            return sum(self._sent.values())

    def delivered_count(self, subscriber: str) -> int:
        with self._lock:
            return len(set(self._arrivals[subscriber]))

    def delivered_count_of(self, subscriber: str, publish: tuple[str, int]) -> int:
        """How many times `subscriber` got `publish` ((publisher, seq))."""
        with self._lock:
            return self._arrivals[subscriber].count(publish)

    def missing(self, subscriber: str) -> int:
        """Acknowledged publishes `subscriber` has not received yet."""
        with self._lock:
            got = set(self._arrivals[subscriber])
            return sum(1 for p, seqs in self._acked.items() for s in seqs if (p, s) not in got)

    def verdict(self) -> Verdict:
        with self._lock:
            v = Verdict(sum(self._sent.values()), sum(len(s) for s in self._acked.values()))
            for name, arrivals in self._arrivals.items():
                counts = Counter(arrivals)
                lost = sorted(
                    (p, s) for p, seqs in self._acked.items() for s in seqs if (p, s) not in counts
                )
                at_q2 = self._q2[name]
                q1 = sum(n - 1 for k, n in counts.items() if k not in at_q2)
                q2 = sorted(k for k, n in counts.items() if n > 1 and k in at_q2)
                last: dict[str, int] = {}
                seen: set[tuple[str, int]] = set()
                order = []
                for p, s in arrivals:
                    if (p, s) in seen:
                        continue
                    seen.add((p, s))
                    if s < last.get(p, -1):
                        order.append((p, s, last[p]))
                    last[p] = max(s, last.get(p, -1))
                v.subscribers[name] = SubscriberVerdict(
                    self._persistent[name], len(counts), len(arrivals), lost, q1, q2, order
                )
            return v
