"""Authentication cost under control (issue 11): an unknown user costs what a wrong password
costs, a flood of password checks is bounded (0x89 beyond the queue), failures back off per
user name and per address, and a password-guessing loop does not slow a bystander.

The first three run against the session service in this process (tests/inproc.py); the
guessing loop runs against a one-node mesh of its own with a small back-off threshold.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.cli.launcher import Launcher
from services.common.connect import ConnectAttempt
from services.common.mqtt.reason import ReasonCode as RC
from services.session.client import SessionAdminClient, SessionClient
from tests.conftest import ADMIN_TOKEN as MESH_TOKEN
from tests.e2e.clients import Paho
from tests.inproc import ADMIN_TOKEN, Core
from tests.security.bystander import Bystander, assert_unharmed

# A bystander's round trip is measured: with nothing else running (docs/testing.md).
pytestmark = pytest.mark.alone

_peer = iter(range(1, 1 << 30))


def fresh_peer() -> str:
    """A peer address of its own, so the per-address back-off of one test stays out of the
    others' way (10.x.y.z)."""
    n = next(_peer) + (uuid.uuid4().int % 1000) * 20_000
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}:1883"


def attempt(username: str, password: bytes, peer: str = "") -> ConnectAttempt:
    return ConnectAttempt(
        client_id=f"c-{uuid.uuid4().hex[:8]}",
        username=username,
        password=password,
        node_id="node-cost",
        peer_address=peer or fresh_peer(),
        protocol_level=5,
        clean_start=True,
        session_expiry_s=0,
    )


@pytest.fixture
async def clients(core: Core) -> AsyncIterator[tuple[SessionClient, SessionAdminClient]]:
    session, admin = SessionClient(core.session), SessionAdminClient(core.session, ADMIN_TOKEN)
    yield session, admin
    await session.close()
    await admin.close()


def tenant() -> str:
    return f"ac{uuid.uuid4().hex[:6]}"


async def test_unknown_user_and_wrong_password_take_the_same_time(
    clients: tuple[SessionClient, SessionAdminClient],
) -> None:
    session, admin = clients
    t = tenant()
    users = [f"u{i}" for i in range(6)]
    for u in users:
        await admin.create_user(t, u, "right")
    wrong: list[float] = []
    unknown: list[float] = []
    for i in range(24):  # interleaved; at most 4 failures per user (under the back-off)
        start = time.perf_counter()
        out = await session.connect(attempt(f"{t}/{users[i % 6]}", b"wrong"))
        wrong.append(time.perf_counter() - start)
        assert out.reason_code == RC.BAD_USER_NAME_OR_PASSWORD
        start = time.perf_counter()
        out = await session.connect(attempt(f"{t}/ghost{i}", b"wrong"))
        unknown.append(time.perf_counter() - start)
        assert out.reason_code == RC.BAD_USER_NAME_OR_PASSWORD  # the same answer, too
    ratio = statistics.median(unknown) / statistics.median(wrong)
    # Without the decoy hash an unknown user answers ~30x faster (no argon2 at all).
    assert 0.6 < ratio < 1.6, (statistics.median(unknown), statistics.median(wrong))


async def test_a_flood_of_password_checks_is_bounded_and_refused_with_0x89(core: Core) -> None:
    # A long deadline: what is checked here is the bound, not the node's 5 s call deadline
    # (on a loaded machine 20 argon2 checks on 4 threads can take longer).
    session = SessionClient(core.session, timeout_s=60)
    t = tenant()
    # 200 at once, each a hash (unknown users cost one too); the gate runs 4 and queues 16.
    outs = await asyncio.gather(*(session.connect(attempt(f"{t}/g{i}", b"pw")) for i in range(200)))
    await session.close()
    codes = [o.reason_code for o in outs]
    assert set(codes) == {RC.BAD_USER_NAME_OR_PASSWORD, RC.SERVER_BUSY}
    assert codes.count(RC.BAD_USER_NAME_OR_PASSWORD) >= 20  # everything admitted was checked


async def test_failures_back_off_the_user_name_and_the_address(
    clients: tuple[SessionClient, SessionAdminClient],
) -> None:
    session, admin = clients
    t = tenant()
    await admin.create_user(t, "victim", "right")
    await admin.create_user(t, "other", "right")
    codes = [
        (await session.connect(attempt(f"{t}/victim", b"guess"))).reason_code for _ in range(7)
    ]
    # 5 failures (each from another address), then the user name is backed off.
    assert codes == [RC.BAD_USER_NAME_OR_PASSWORD] * 5 + [RC.SERVER_BUSY] * 2
    # Even the right password waits out the back-off: nothing is checked meanwhile...
    assert (await session.connect(attempt(f"{t}/victim", b"right"))).reason_code == RC.SERVER_BUSY
    # ...while another user of the tenant is not affected.
    assert (await session.connect(attempt(f"{t}/other", b"right"))).ok

    # One address guessing many user names: backed off after 20 failures, for every user.
    address = fresh_peer()
    for i in range(20):
        out = await session.connect(attempt(f"{t}/n{i}", b"guess", address))
        assert out.reason_code == RC.BAD_USER_NAME_OR_PASSWORD
    assert (await session.connect(attempt(f"{t}/other", b"right", address))).reason_code == (
        RC.SERVER_BUSY
    )
    assert (await session.connect(attempt(f"{t}/other", b"right"))).ok  # other addresses: fine


# ---- a guessing loop beside a bystander, end to end ------------------------------------


@pytest.fixture(scope="module")
def guarded_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(
        data_dir=tmp_path_factory.mktemp("auth-cost") / "run",
        nodes=1,
        mqtt_port=0,
        anonymous=False,
        ws=False,
        extra_env={
            "STARLING_ADMIN_TOKEN": MESH_TOKEN,
            "STARLING_AUTH_FAILURES_BEFORE_BACKOFF_USER": "3",
            "STARLING_AUTH_FAILURES_BEFORE_BACKOFF_IP": "1000",
            "STARLING_AUTH_BACKOFF_BASE_S": "60",
            "STARLING_AUTH_BACKOFF_MAX_S": "600",
        },
    )
    launcher.start(timeout_s=60)
    yield launcher
    launcher.stop()


async def test_password_guessing_is_backed_off_while_a_bystander_keeps_its_round_trip(
    guarded_mesh: Launcher,
) -> None:
    import grpc

    from starling.session.v1 import session_pb2 as pb
    from starling.session.v1 import session_pb2_grpc as pb_grpc
    from tests.e2e.admin import MD

    session_port = guarded_mesh.mesh.by_name("session").grpc_port
    stub = pb_grpc.SessionAdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{session_port}"))
    t = tenant()
    for user in ("victim", "bystander"):
        stub.CreateUser(
            pb.CreateUserRequest(tenant=t, username=user, password="right"), metadata=MD
        )
    port = guarded_mesh.mesh.by_name("connection-0").port

    def guess() -> list[int]:
        codes = []
        for i in range(30):
            guess = Paho(port, username=f"{t}/victim", password=f"guess-{i}")
            codes.append(int(guess.connect(expect_ok=False).value))
            guess.c.loop_stop()
        return codes

    async with Bystander(port, username=f"{t}/bystander", password="right") as b:
        codes = await asyncio.to_thread(guess)
    assert_unharmed(b)
    assert codes[:3] == [0x86] * 3
    assert codes[3:] == [0x89] * 27  # backed off: refused before any hash work
    # The right password is refused too until the back-off period ends.
    late = Paho(port, username=f"{t}/victim", password="right")
    assert int(late.connect(expect_ok=False).value) == 0x89
    late.c.loop_stop()
