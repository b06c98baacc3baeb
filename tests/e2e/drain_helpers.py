"""What the drain tests (tests/e2e/test_drain.py) drive a drained node with: the CLI and the
admin call that start a drain, raw MQTT clients, a thread that records what the server sent
on each socket and when it closed it, and a QoS 1 publisher that follows a Server Reference."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from services.cli.launcher import Launcher
from services.common.mqtt import ConnAck, Connect, Disconnect, PubAck, Publish
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.client import ConnectionAdminClient, DrainProgress
from tests.cli.in_process import starling_in_process
from tests.e2e.clients import Paho, Raw

RATE = 20  # connections closed per second while draining
A, B = "connection-0", "connection-1"
STARLING = [sys.executable, "-m", "services.cli.main"]  # the CLI in a process of its own


def _port(launcher: Launcher, node: str) -> int:
    return launcher.mesh.by_name(node).port


def _drain(launcher: Launcher, node: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`starling drain NODE` (without `--wait`) run in this process (tests/cli/in_process.py);
    tests/e2e/test_drain.py runs it in processes of its own too (`STARLING`)."""
    return starling_in_process("drain", node, "--data-dir", launcher.mesh.data_dir, *extra)


async def _ask_drain(launcher: Launcher, node: str, reference: str) -> DrainProgress:
    comp = launcher.mesh.by_name(node)
    client = ConnectionAdminClient(f"127.0.0.1:{comp.grpc_port}", launcher.admin_token)
    try:
        return await client.drain(reference)
    finally:
        await client.close()


def _raw(port: int, tenant: str, client_id: str, level: int, **kw: object) -> Raw:
    raw = Raw(port, level=level)
    ack = raw.connect(Connect(client_id, level, username=f"{tenant}/u", **kw))  # type: ignore[arg-type]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@dataclass
class Watched:
    """What the server sent on each socket until it closed it, and when it closed it."""

    data: dict[socket.socket, bytearray] = field(default_factory=dict)
    closed_at: dict[socket.socket, float] = field(default_factory=dict)


def _watch(socks: list[socket.socket], timeout_s: float) -> tuple[threading.Thread, Watched]:
    """Read every socket in a thread until the server closes it (recording when)."""
    seen = Watched({s: bytearray() for s in socks})

    def run() -> None:
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while len(seen.closed_at) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    seen.data[s] += chunk
                else:
                    seen.closed_at[s] = time.monotonic()
                    sel.unregister(s)
        sel.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seen


class Publisher(threading.Thread):
    """Publishes QoS 1 messages one at a time (the next once the last was acknowledged);
    told 0x9C it goes where the Server Reference says and sends the unacknowledged
    message again. `acked`: the numbers of the acknowledged messages."""

    def __init__(self, port: int, tenant: str) -> None:
        super().__init__(daemon=True)
        self.port, self.tenant = port, tenant
        self.acked: list[int] = []
        self.references: list[str] = []
        self.ports: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _connect(self, port: int) -> Raw:
        self.ports.append(port)
        return _raw(port, self.tenant, "publisher", 5)

    def run(self) -> None:
        try:
            raw, n, pid = self._connect(self.port), 0, 0
            while not self.stop.is_set():
                pid = pid % 65535 + 1
                raw.send(Publish(f"load/{n}", str(n).encode(), 1, packet_id=pid))
                reply = raw.recv()
                if isinstance(reply, PubAck) and reply.packet_id == pid:
                    assert reply.reason_code == 0, reply
                    self.acked.append(n)
                    n += 1
                    continue
                assert isinstance(reply, Disconnect), reply
                assert reply.reason_code == RC.USE_ANOTHER_SERVER
                ref = reply.properties.server_reference or ""
                self.references.append(ref)
                raw.close()
                raw = self._connect(int(ref.split()[0].rsplit(":", 1)[1]))
            raw.send(Disconnect())
            raw.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _payloads(*clients: Paho) -> set[int]:
    got: set[int] = set()
    for c in clients:
        while not c.messages.empty():
            got.add(int(c.messages.get_nowait().payload))
    return got
