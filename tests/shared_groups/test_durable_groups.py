"""Durable shared groups on a two-node mesh: a `$share/<group>/<filter>` of persistent
sessions owns a queue (services/common/group_routes.py, services/queue/groups.py). What is
acknowledged to a publisher reaches the group once, whether its members are online or not;
a member's unacknowledged messages go to another member when it leaves; the queue goes with
the last member's session."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from services.common.mqtt import Connect, Publish, SubAck, Subscribe, Subscription
from services.common.mqtt.properties import Properties
from tests.e2e.clients import Raw
from tests.poll import holds_within, wait_until
from tests.shared_groups.conftest import (
    Member,
    group_launcher,
    group_state,
    members,
    node_port,
    publish_all,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("durable-groups")
    with group_launcher(folder) as launcher:
        yield launcher


def _names(prefix: str) -> tuple[str, str]:
    """A fresh group name and topic."""
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}{tag}", f"dg/{tag}"


def _arrived(ms: list[Member]) -> Counter[str]:
    return Counter(p for m in ms for p in m.payloads())


def test_offline_members_get_every_acknowledged_message_once(launcher: Launcher) -> None:
    group, topic = _names("off")
    ms = members(launcher, 2, f"$share/{group}/{topic}")
    for m in ms:
        m.close()
    sent = [str(i) for i in range(1000)]
    acked = publish_all(node_port(launcher, 0), topic, sent)
    assert acked == set(sent)
    assert group_state(launcher, group, topic) == (1000, 1000)  # stored once for the group
    for m in ms:
        assert m.connect() is True  # the sessions were kept
    wait_until(lambda: sum(_arrived(ms).values()) >= 1000, 30, lambda: f"{_arrived(ms).total()}")
    assert not holds_within(lambda: sum(_arrived(ms).values()) > 1000, 1.0)
    got = _arrived(ms)
    assert set(got) == set(sent) and max(got.values()) == 1  # each exactly once in the group
    assert all(m.payloads() for m in ms), [len(m.payloads()) for m in ms]  # split
    assert all(m.dups == 0 for m in ms)
    wait_until(lambda: group_state(launcher, group, topic) == (1000, 0), 10, "the queue acked")
    for m in ms:
        m.close()


def test_an_online_member_does_not_wait_for_an_offline_one(launcher: Launcher) -> None:
    group, topic = _names("on")
    online, offline = members(launcher, 2, f"$share/{group}/{topic}")
    offline.close()
    sent = [str(i) for i in range(200)]
    assert publish_all(node_port(launcher, 1), topic, sent) == set(sent)
    wait_until(lambda: len(online.payloads()) >= 200, 15, lambda: f"{len(online.payloads())}")
    assert sorted(online.payloads(), key=int) == sent
    assert online.payloads() == sent  # one publisher: its order, within the member
    offline.connect()
    assert not holds_within(lambda: offline.payloads(), 1.0)  # nothing was left for it
    online.close()
    offline.close()


class Hoarder:
    """A member (raw MQTT 5 client, Receive Maximum 20) that takes messages and never
    acknowledges them."""

    def __init__(self, port: int, filt: str) -> None:
        self.client_id = f"hoard-{uuid.uuid4().hex[:8]}"
        self.filt = filt
        self.port = port
        self.raw = self._connect()
        self.raw.send(Subscribe(1, (Subscription(filt, 1),)))
        assert isinstance(self.raw.recv(), SubAck)
        self.got: list[str] = []

    def _connect(self) -> Raw:
        raw = Raw(self.port)
        props = Properties(receive_maximum=20, session_expiry_interval=300)
        raw.connect(Connect(self.client_id, 5, clean_start=False, properties=props))
        return raw

    def take(self, n: int) -> None:
        while len(self.got) < n:
            p = self.raw.recv()
            if isinstance(p, Publish):
                self.got.append(p.payload.decode())


def test_a_leaving_members_unacknowledged_messages_go_to_another(launcher: Launcher) -> None:
    group, topic = _names("leave")
    filt = f"$share/{group}/{topic}"
    hoarder = Hoarder(node_port(launcher, 0), filt)
    sent = [str(i) for i in range(50)]
    assert publish_all(node_port(launcher, 1), topic, sent) == set(sent)
    hoarder.take(20)  # its whole window, never acknowledged
    (other,) = members(launcher, 1, f"$share/{group}/{topic}")
    wait_until(lambda: len(other.payloads()) >= 30, 15, lambda: f"{len(other.payloads())}")
    assert not set(other.payloads()) & set(hoarder.got)
    hoarder.raw.close()  # leaves with 20 unacknowledged (its session stays)
    wait_until(lambda: len(other.payloads()) >= 50, 15, lambda: f"{len(other.payloads())}")
    assert sorted(other.payloads(), key=int) == sent  # every message, once
    other.close()


def test_the_queue_goes_with_the_last_members_session(launcher: Launcher) -> None:
    group, topic = _names("last")
    first, second = members(launcher, 2, f"$share/{group}/{topic}")
    first.close()
    second.close()
    assert publish_all(node_port(launcher, 0), topic, ["a", "b", "c"]) == {"a", "b", "c"}
    assert group_state(launcher, group, topic) == (3, 3)
    # A clean start ends the first member's session: the group keeps its queue.
    assert first.connect(clean_start=True) is False
    first.close()
    assert holds_within(lambda: group_state(launcher, group, topic) == (3, 3), 1.0)
    # The last member's session expires: the queue and what it held go.
    second.connect(expiry_s=1)
    second.close()
    wait_until(lambda: group_state(launcher, group, topic) is None, 20, "the group's queue")


def test_an_unsubscribing_last_member_drops_the_queue(launcher: Launcher) -> None:
    group, topic = _names("unsub")
    (m,) = members(launcher, 1, f"$share/{group}/{topic}")
    m.close()
    assert publish_all(node_port(launcher, 1), topic, ["x"]) == {"x"}
    assert group_state(launcher, group, topic) == (1, 1)
    m.connect()
    wait_until(lambda: m.payloads() == ["x"], 10)
    assert m.c is not None
    m.c.unsubscribe(f"$share/{group}/{topic}")
    wait_until(lambda: group_state(launcher, group, topic) is None, 10, "the group's queue")
    m.close()


def test_qos2_members_get_each_message_once(launcher: Launcher) -> None:
    group, topic = _names("q2")
    ms = members(launcher, 2, f"$share/{group}/{topic}", qos=2)
    sent = [str(i) for i in range(100)]
    assert publish_all(node_port(launcher, 0), topic, sent, qos=2) == set(sent)
    wait_until(lambda: sum(_arrived(ms).values()) >= 100, 15, lambda: f"{_arrived(ms).total()}")
    got = _arrived(ms)
    assert set(got) == set(sent) and max(got.values()) == 1
    wait_until(lambda: group_state(launcher, group, topic) == (100, 0), 10, "the queue acked")
    for m in ms:
        m.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_clean_members_of_a_durable_group_read_its_queue(launcher: Launcher, qos: int) -> None:
    group, topic = _names(f"mix{qos}")
    (durable,) = members(launcher, 1, f"$share/{group}/{topic}", qos=qos)
    clean = Member(node_port(launcher, 1), f"clean-{group}")
    clean.connect(clean_start=True, expiry_s=0)
    clean.subscribe(f"$share/{group}/{topic}", qos)
    ms = [durable, clean]
    sent = [str(i) for i in range(200)]
    assert publish_all(node_port(launcher, 0), topic, sent, qos=qos) == set(sent)
    wait_until(lambda: sum(_arrived(ms).values()) >= 200, 15, lambda: f"{_arrived(ms).total()}")
    assert not holds_within(lambda: sum(_arrived(ms).values()) > 200, 0.5)
    got = _arrived(ms)
    assert set(got) == set(sent) and max(got.values()) == 1
    assert durable.payloads() and clean.payloads(), [len(m.payloads()) for m in ms]
    # The last persistent member leaves: the queue goes, the clean member takes NATS again.
    assert durable.c is not None
    durable.c.unsubscribe(f"$share/{group}/{topic}")
    wait_until(lambda: group_state(launcher, group, topic) is None, 10, "the group's queue")
    more = [f"n{i}" for i in range(20)]

    def reaches_clean() -> bool:
        publish_all(node_port(launcher, 0), topic, more[:1], qos=qos)
        return "n0" in clean.payloads()

    wait_until(reaches_clean, 10, "a message through NATS")
    for m in ms:
        m.close()
