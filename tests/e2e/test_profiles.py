"""`starling up`'s settings profiles, as a test suite or a benchmark on one machine meets them:
every client comes from 127.0.0.1.

- development (the default): 10,000 clients from one address are all accepted, and one
  client id reconnecting 40 times within a minute is never banned;
- production (`--profile production`, the services' own defaults): the 1,001st connection
  from one address is refused (CONNACK 0x97) with a reason naming max_connections_per_ip,
  and a client id connecting a 16th time within the window is banned (0x8A) with a reason
  naming the flapping settings. A STARLING_* variable of the caller still wins over the
  profile (here: anonymous clients, which production does not allow by itself).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import loadgen
from bench.machine import open_files_to_hard_limit
from services.common.mqtt import ConnAck, Connect
from tests.cli.up_process import Up, running_up
from tests.e2e.clients import Raw

pytestmark = pytest.mark.timeout(240)

QUOTA_EXCEEDED, BANNED = 0x97, 0x8A


@pytest.fixture(scope="module", autouse=True)
def open_files() -> None:
    """10,000 sockets in this process and as many in the node, which inherits the limit."""
    if open_files_to_hard_limit() < 10_000 + 500:
        pytest.skip("RLIMIT_NOFILE hard limit below 10,500")


def _connect(port: int, client_id: str) -> ConnAck:
    """One MQTT 5 CONNECT and its CONNACK; the socket is closed again."""
    raw = Raw(port, 5)
    try:
        ack = raw.connect(Connect(client_id, 5, keepalive_s=30))
        assert isinstance(ack, ConnAck)
        return ack
    finally:
        raw.close()


def _reconnects(port: int, client_id: str, times: int) -> list[ConnAck]:
    """`times` CONNECTs of one client id, one after the other, until one is refused."""
    acks: list[ConnAck] = []
    for _ in range(times):
        acks.append(_connect(port, client_id))
        if acks[-1].reason_code:
            break
    return acks


@pytest.fixture(scope="module")
def development(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(tmp_path_factory.mktemp("dev")) as up:
        yield up


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    env = {"STARLING_ANONYMOUS_TENANTS": '["*"]'}
    with running_up(tmp_path_factory.mktemp("prod"), "--profile", "production", env=env) as up:
        yield up


def test_the_default_profile_accepts_10000_clients_from_one_address(development: Up) -> None:
    assert "profile development" in development.status().stdout

    async def go() -> int:
        res = await loadgen.connect_rate(development.mqtt_port, 10_000, outstanding=64)
        try:
            return res.connected
        finally:
            res.close()

    assert asyncio.run(go()) == 10_000


def test_the_default_profile_never_bans_a_client_that_reconnects_often(development: Up) -> None:
    acks = _reconnects(development.mqtt_port, f"suite-{uuid.uuid4().hex[:6]}", 40)
    assert [a.reason_code for a in acks] == [0] * 40


def test_production_bans_a_flapping_client_and_says_which_setting(production: Up) -> None:
    assert "profile production" in production.status().stdout
    acks = _reconnects(production.mqtt_port, f"flappy-{uuid.uuid4().hex[:6]}", 20)
    codes = [a.reason_code for a in acks]
    assert codes[:15] == [0] * 15 and codes[15] == BANNED, codes
    reason = acks[15].properties.reason_string or ""
    assert "flapping_max_connects" in reason and "flapping_enabled" in reason, reason


def test_production_refuses_the_1001st_connection_of_one_address(production: Up) -> None:
    async def go() -> tuple[int, ConnAck]:
        res = await loadgen.connect_rate(production.mqtt_port, 1_000, outstanding=64)
        try:
            extra = await asyncio.to_thread(
                _connect, production.mqtt_port, f"extra-{uuid.uuid4().hex[:6]}"
            )
            return res.connected, extra
        finally:
            res.close()

    connected, extra = asyncio.run(go())
    assert connected == 1_000
    assert extra.reason_code == QUOTA_EXCEEDED
    reason = extra.properties.reason_string or ""
    assert "max_connections_per_ip" in reason, reason


def test_the_profile_flag_refuses_an_unknown_name(tmp_path: Path) -> None:
    from tests.cli.up_process import starling

    done = starling("up", "--data-dir", str(tmp_path), "--profile", "staging")
    assert done.returncode == 2 and "invalid choice: 'staging'" in done.stderr
