"""A well-behaved client that times its own messages while an attack runs on the same node.

    async with Bystander(port) as b:
        ...attack...
    assert b.p99_rtt_ms < 100 and b.lost == 0, b.summary()

One MQTT 5 connection subscribes to a topic of its own at QoS 1 and another publishes to it
at QoS 1 every `interval_s`; each delivery's publish-to-deliver time is recorded. On exit (at
least `min_duration_s` after the start) publishing stops, the messages still under way get
`drain_s` to arrive (the ones that do not are `lost`), and both connections close.

The probe runs in a child process (`python -m tests.security.bystander`), so what it
measures is the node, not the test process busy building and sending the attack; the child
reports its samples as JSON on exit and is killed if it does not finish.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    MqttError,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from services.common.mqtt.packets import Packet

T = TypeVar("T")
_SEQ = struct.Struct(">Q")
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ProbeSettings:
    port: int
    interval_s: float = 0.01
    drain_s: float = 3.0
    window: int = 10  # unacknowledged publishes at most (below the node's receive maximum)
    min_duration_s: float = 1.0  # measure at least this long, however brief the attack
    username: str = ""  # for meshes without anonymous access ("tenant/user")
    password: str = ""


class Bystander:
    """Async context manager around the probe process; results are attributes after exit."""

    def __init__(self, port: int, **settings: Any) -> None:
        self.settings = ProbeSettings(port, **settings)
        self.rtts_ms: list[float] = []
        self.sent = 0
        self.received = 0
        self.skipped = 0  # ticks with `window` publishes unacknowledged: the node lags
        self.errors: list[str] = []  # what ended the probe's loops early
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def lost(self) -> int:
        """Messages published that never arrived."""
        return self.sent - self.received

    @property
    def max_rtt_ms(self) -> float:
        return max(self.rtts_ms, default=0.0)

    @property
    def p99_rtt_ms(self) -> float:
        if not self.rtts_ms:
            return 0.0
        ordered = sorted(self.rtts_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def summary(self) -> str:
        return (
            f"bystander on port {self.settings.port}: sent {self.sent}, lost {self.lost}, "
            f"skipped {self.skipped}, max {self.max_rtt_ms:.1f} ms, p99 {self.p99_rtt_ms:.1f} ms"
            + (f", errors {self.errors}" if self.errors else "")
        )

    async def __aenter__(self) -> Bystander:
        self._proc = proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.security.bystander",
            json.dumps(asdict(self.settings)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=_ROOT,
        )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            proc.kill()
            await proc.wait()
            raise AssertionError(f"bystander did not start: {line!r}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            s = self.settings
            out = await asyncio.wait_for(proc.stdout.read(), s.min_duration_s + s.drain_s + 20)
            result = json.loads(out)
            self.rtts_ms = result["rtts_ms"]
            self.sent = result["sent"]
            self.received = result["received"]
            self.skipped = result["skipped"]
            self.errors = result["errors"]
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


# ---- the probe (runs in the child process) ----------------------------------------------------


class _Client:
    """One MQTT 5 connection over asyncio streams, speaking through the project's codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = Decoder(5)
        self.pending: list[Packet] = []

    @classmethod
    async def connect(cls, s: ProbeSettings, client_id: str) -> _Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        c = cls(reader, writer)
        c.send(
            Connect(
                client_id,
                5,
                keepalive_s=60,
                username=s.username or None,
                password=s.password.encode() if s.password else None,
            )
        )
        ack = await c.recv()
        if not (isinstance(ack, ConnAck) and ack.reason_code == 0):
            raise AssertionError(f"bystander {client_id} refused: {ack}")
        return c

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, 5))

    async def recv(self, timeout_s: float = 10.0) -> Packet:
        async with asyncio.timeout(timeout_s):
            while not self.pending:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("bystander connection closed by the server")
                self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def close(self) -> None:
        self.writer.write(b"\xe0\x00")  # DISCONNECT, normal
        self.writer.close()


class _Probe:
    def __init__(self, s: ProbeSettings) -> None:
        self.s = s
        self.topic = f"bystander/{uuid.uuid4().hex[:12]}"
        self.rtts_ms: list[float] = []
        self.sent = 0
        self.skipped = 0
        self.errors: list[str] = []
        self._sent_at: dict[int, float] = {}
        self._unacked = 0
        self._received: set[int] = set()
        self._arrived = asyncio.Event()  # set by every first arrival
        self._tasks: list[asyncio.Task[None]] = []
        self._sub: _Client | None = None
        self._pub: _Client | None = None
        self._started = 0.0

    async def start(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self._sub = sub = await _Client.connect(self.s, f"bystander-sub-{tag}")
        sub.send(Subscribe(1, (Subscription(self.topic, 1),)))
        ack = await sub.recv()
        assert isinstance(ack, SubAck) and ack.reason_codes == (1,), ack
        self._pub = await _Client.connect(self.s, f"bystander-pub-{tag}")
        self._tasks = [
            asyncio.create_task(self._noting_errors(self._read_deliveries())),
            asyncio.create_task(self._noting_errors(self._read_acks())),
        ]
        # One round trip before the attack starts: the path is warm and works.
        self._publish()
        await asyncio.wait_for(self._arrived.wait(), 10)
        self.rtts_ms.clear()
        self._started = time.monotonic()
        self._tasks.append(asyncio.create_task(self._publish_loop()))

    async def stop(self) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, self._started + self.s.min_duration_s - time.monotonic()))
        publisher = self._tasks.pop()
        publisher.cancel()
        deadline = time.monotonic() + self.s.drain_s
        while self.sent > len(self._received) and (left := deadline - time.monotonic()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                break
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(publisher, *self._tasks, return_exceptions=True)
        for c in (self._sub, self._pub):
            if c is not None:
                c.close()
        return {
            "rtts_ms": self.rtts_ms,
            "sent": self.sent,
            "received": len(self._received),
            "skipped": self.skipped,
            "errors": self.errors,
        }

    async def _noting_errors(self, loop: Coroutine[Any, Any, None]) -> None:
        try:
            await loop
        except (ConnectionError, OSError, TimeoutError, MqttError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _publish(self) -> None:
        assert self._pub is not None
        seq = self.sent
        self.sent += 1
        self._unacked += 1
        self._sent_at[seq] = time.perf_counter()
        pid = seq % 65535 + 1
        self._pub.send(Publish(self.topic, _SEQ.pack(seq), 1, packet_id=pid))

    async def _publish_loop(self) -> None:
        next_at = time.perf_counter()
        while True:
            if self._unacked < self.s.window:
                self._publish()
            else:
                self.skipped += 1
            next_at += self.s.interval_s
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    async def _read_deliveries(self) -> None:
        sub = self._sub
        assert sub is not None
        while True:
            p = await sub.recv(timeout_s=3600)
            if not isinstance(p, Publish) or p.topic != self.topic:
                continue
            if p.packet_id:
                sub.send(PubAck(p.packet_id))
            (seq,) = _SEQ.unpack(p.payload)
            if seq in self._received:
                continue  # a redelivery: the first arrival counted
            self._received.add(seq)
            self._arrived.set()
            self.rtts_ms.append((time.perf_counter() - self._sent_at[seq]) * 1000)

    async def _read_acks(self) -> None:
        pub = self._pub
        assert pub is not None
        while True:
            p = await pub.recv(timeout_s=3600)
            if isinstance(p, PubAck):
                self._unacked -= 1


async def _child(settings: ProbeSettings) -> None:
    probe = _Probe(settings)
    await probe.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # "stop", or EOF if the test died
    print(json.dumps(await probe.stop()), flush=True)


# Issue 11: a bystander's publish -> deliver round trip stays under this during an attack.
RTT_BOUND_MS = 100.0


def beside_a_bystander(port: int, attack: Callable[[], T], **settings: Any) -> T:
    """Run a blocking `attack` while a bystander on `port` times its messages; assert the
    bystander was unharmed and return what the attack returned."""

    async def run() -> tuple[T, Bystander]:
        async with Bystander(port, **settings) as b:
            result = await asyncio.to_thread(attack)
        return result, b

    result, b = asyncio.run(run())
    assert_unharmed(b)
    return result


def assert_unharmed(b: Bystander) -> None:
    """The bystander kept its round trip (p99: one late sample among a hundred may be the
    machine, not the node), lost nothing, and did run during the attack."""
    assert b.p99_rtt_ms < RTT_BOUND_MS and b.lost == 0 and not b.errors, b.summary()
    assert len(b.rtts_ms) >= 50, b.summary()


if __name__ == "__main__":
    asyncio.run(_child(ProbeSettings(**json.loads(sys.argv[1]))))
