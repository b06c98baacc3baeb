"""Helpers of the durable shared group tests: members with persistent sessions, publishers
that count what was acknowledged, and the group queue's row in the store."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from paho.mqtt.subscribeoptions import SubscribeOptions

from services.cli.launcher import Launcher
from services.common.group_routes import group_queue_id
from tests.poll import wait_until

TIMEOUT_S = 10.0


@contextmanager
def group_launcher(folder: Path, **extra: Any) -> Iterator[Launcher]:
    """A two-node mesh of anonymous clients (`extra`: Launcher arguments; `env`: settings)."""
    env = {"STARLING_LOG_LEVEL": "INFO", **extra.pop("env", {})}
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env=env,
        **extra,
    )
    launcher.start(timeout_s=60)
    try:
        yield launcher
    finally:
        launcher.stop()


def node_port(launcher: Launcher, i: int) -> int:
    return launcher.mesh.by_name(f"connection-{i}").port


class Member:
    """An MQTT 5 client with a persistent session (Session Expiry `expiry_s`) that records
    the payloads it receives (acknowledged by paho at once)."""

    def __init__(self, port: int, client_id: str, receive_maximum: int = 10) -> None:
        self.port = port
        self.client_id = client_id
        self.receive_maximum = receive_maximum
        self.got: list[str] = []
        self.dups = 0
        self._lock = threading.Lock()
        self.c: mqtt.Client | None = None

    def connect(self, clean_start: bool = False, expiry_s: int = 300) -> bool:
        """Connect; the CONNACK's session present flag."""
        c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5
        )
        connacks: list[Any] = []
        done = threading.Event()

        def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
            connacks.append((flags.session_present, rc))
            done.set()

        c.on_connect = on_connect
        c.on_message = self._on_message
        props = PahoProps(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry_s
        props.ReceiveMaximum = self.receive_maximum
        c.connect("127.0.0.1", self.port, clean_start=clean_start, properties=props)
        c.loop_start()
        assert done.wait(TIMEOUT_S), "no CONNACK"
        present, rc = connacks[0]
        assert not rc.is_failure, f"CONNACK {rc}"
        self.c = c
        return bool(present)

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.got.append(m.payload.decode())
            self.dups += int(m.dup)

    def subscribe(self, filt: str, qos: int = 1) -> None:
        assert self.c is not None
        acked = threading.Event()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: acked.set()
        self.c.subscribe(filt, options=SubscribeOptions(qos=qos))
        assert acked.wait(TIMEOUT_S), "no SUBACK"

    def close(self) -> None:
        """DISCONNECT; the session stays (its expiry as connected)."""
        if self.c is not None:
            self.c.disconnect()
            self.c.loop_stop()
            self.c = None

    def payloads(self) -> list[str]:
        with self._lock:
            return list(self.got)


def members(
    launcher: Launcher, n: int, filt: str, receive_maximum: int = 10, qos: int = 1
) -> list[Member]:
    """`n` members of the shared subscription `filt` (alternating nodes), connected."""
    out = []
    for i in range(n):
        m = Member(node_port(launcher, i % 2), f"m{i}-{uuid.uuid4().hex[:8]}", receive_maximum)
        m.connect()
        m.subscribe(filt, qos)
        out.append(m)
    return out


def publish_all(port: int, topic: str, payloads: list[str], qos: int = 1) -> set[str]:
    """Publish at `qos` (MQTT 5); the payloads the broker acknowledged with success."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    codes: dict[int, int] = {}
    c.on_publish = lambda c, u, mid, rc, p: codes.__setitem__(mid, rc.value)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [(p, c.publish(topic, p, qos)) for p in payloads]
        for _, info in infos:
            info.wait_for_publish(30)
        wait_until(lambda: len(codes) >= len(infos), TIMEOUT_S, "every PUBACK")
        return {p for p, info in infos if codes.get(info.mid, 0x80) < 0x80}
    finally:
        c.disconnect()
        c.loop_stop()


def group_state(launcher: Launcher, group: str, filt: str) -> tuple[int, int] | None:
    """(last_seq, depth) of the group's queue in the SQLite store; None: no such queue."""
    db = Path(launcher.mesh.data_dir) / "data" / "queues.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT last_seq, depth FROM queue_state WHERE tenant='default' AND queue_id=?",
            (group_queue_id(group, filt),),
        ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))
