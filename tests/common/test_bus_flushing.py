"""`flushed` (services/common/bus/flushing.py) against a real nats-server with its protocol
trace on: the server reads every SUB and PUB sent before the call ahead of the PING whose
PONG ends it (a subscription made then gets what another connection publishes next), and a
server that stops answering makes it fail."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nats
import pytest
from nats.aio.msg import Msg
from nats.errors import FlushTimeoutError

from services.cli.launcher import nats_binary
from services.cli.ports import free_port
from services.common.bus.flushing import flushed
from tests.conftest import wait_port
from tests.poll import eventually


class Traced(NamedTuple):
    url: str
    log: Path
    pid: int


async def _ignore(msg: Msg) -> None:
    pass


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[Traced]:
    """A nats-server tracing every protocol line it reads to a log file."""
    port, log = free_port(), tmp_path / "nats.log"
    proc = subprocess.Popen(
        [nats_binary(), "-a", "127.0.0.1", "-p", str(port), "-V", "-l", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc, "nats-server")
        yield Traced(f"nats://127.0.0.1:{port}", log, proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def _read_by(log: Path, name: str) -> list[str]:
    """The protocol lines the server read from the connection called `name`, in order."""
    lines = log.read_text().splitlines()
    return [m.group(1) for line in lines if (m := re.search(rf":{name}\" - <<- \[(.*)\]$", line))]


async def test_what_was_sent_before_reaches_the_server_ahead_of_the_ping(
    traced: Traced,
) -> None:
    url, log, _ = traced
    nc = await nats.connect(url, name="flushing")
    got: list[bytes] = []

    async def keep(msg: Msg) -> None:
        got.append(msg.data)

    try:
        for i in range(20):
            await nc.subscribe(f"probe.{i}", cb=keep)
            await flushed(nc)
            await nc.publish(f"probe.{i}", b"x")
            await flushed(nc)
        await eventually(lambda: len(got) == 20, 5, lambda: f"{len(got)} of 20 delivered")
    finally:
        await nc.close()
    read = [line for line in _read_by(log, "flushing") if line.split()[0] in ("SUB", "PUB", "PING")]
    # The first PING is the connection's handshake; then each SUB and PUB before its PING.
    assert read[0] == "PING"
    for i in range(20):
        sub, ping, pub, ping2 = read[1 + 4 * i : 5 + 4 * i]
        assert sub.startswith(f"SUB probe.{i} ") and ping == "PING", read[1 + 4 * i : 5 + 4 * i]
        assert pub.startswith(f"PUB probe.{i} ") and ping2 == "PING", read[1 + 4 * i : 5 + 4 * i]


async def test_a_server_that_stops_answering_fails_it_in_bounded_time(
    traced: Traced,
) -> None:
    """A flush that cannot be confirmed raises nats' FlushTimeoutError (the SUBACK or the
    announcement waiting on it fails) instead of waiting for ever or passing unconfirmed."""
    nc = await nats.connect(traced.url, name="stalled", allow_reconnect=False)
    server = traced.pid
    try:
        os.kill(server, signal.SIGSTOP)
        try:
            # Stopped once every thread of the server is (kill returns before that).
            await eventually(lambda: _state(server) == "T", 5, "the server stopped")
            await nc.subscribe("stalled.x", cb=_ignore)
            with pytest.raises(FlushTimeoutError):
                await flushed(nc, 1)
        finally:
            os.kill(server, signal.SIGCONT)
    finally:
        await nc.close()


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]
