"""CONNECTs over NATS (services/session/client.py `use_bus`), against the session service in
this process (tests/inproc.py): the CONNECTs of one loop turn travel as one ConnectMany call
and each gets its own answer, as if asked alone; a refusal stays its own; a lone CONNECT and a
disconnect go as single requests; CONNECTs asked for while a call is in flight wait for it and
go together; ConnectMany refuses more than CONNECT_BATCH."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus.flushing import flushed
from services.common.connect import ConnectAttempt
from services.common.mqtt.reason import ReasonCode
from services.common.rpc.errors import InvalidArgumentError
from services.session.client import CONNECT_BATCH, SessionAdminClient, SessionClient
from starling.session.v1 import session_pb2 as pb
from tests.inproc import ADMIN_TOKEN, OPEN_TENANT, Core
from tests.poll import eventually


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_url)
    yield nc
    await nc.close()


def attempt(client_id: str, username: str = "", password: bytes | None = None) -> ConnectAttempt:
    return ConnectAttempt(
        client_id=client_id,
        username=username,
        password=password,
        node_id="node-many",
        peer_address="127.0.0.1:50000",
        protocol_level=5,
        clean_start=False,
        session_expiry_s=600,
    )


async def test_the_connects_of_one_turn_each_get_their_own_answer(core: Core, bus: Client) -> None:
    session = SessionClient(core.session)
    session.use_bus(bus)
    admin = SessionAdminClient(core.session, ADMIN_TOKEN)
    tenant = f"many{uuid.uuid4().hex[:6]}"
    await admin.create_user(tenant, "alice", "pw")
    prefix = uuid.uuid4().hex[:6]
    try:
        ids = [f"{prefix}-{i}" for i in range(3 * CONNECT_BATCH + 5)]  # several calls
        attempts = [attempt(c, f"{OPEN_TENANT}/{c}") for c in ids]
        attempts.append(attempt(f"{prefix}-alice", f"{tenant}/alice", b"pw"))
        attempts.append(attempt(f"{prefix}-mallory", f"{tenant}/alice", b"wrong"))
        outcomes = await asyncio.gather(*(session.connect(a) for a in attempts))
        *anonymous, alice, mallory = outcomes
        assert all(o.ok and o.tenant == OPEN_TENANT for o in anonymous)
        assert len({o.epoch for o in anonymous}) == len(ids)
        assert alice.ok and alice.tenant == tenant and alice.identity == f"{tenant}/alice"
        assert mallory.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
        # Each one is registered as its own connection.
        held = {c.client_id: c for c in await admin.list_clients(OPEN_TENANT)}
        assert all(held[c].node_id == "node-many" for c in ids)
        # The same again, now resuming: every session is present, alone or together.
        again = await asyncio.gather(*(session.connect(a) for a in attempts[:-1]))
        assert all(o.ok and o.session_present for o in again)
        alone = await session.connect(attempt(ids[0], f"{OPEN_TENANT}/{ids[0]}"))
        assert alone.ok and alone.session_present and alone.epoch > again[0].epoch
        assert await session.disconnect(OPEN_TENANT, ids[0], alone.epoch, "node-many", 0, 0)
    finally:
        await session.close()
        await admin.close()


async def test_connect_many_refuses_more_than_a_batch(bus: Client) -> None:
    many = pb.ConnectManyRequest(
        requests=[pb.ConnectRequest(client_id=f"c{i}") for i in range(CONNECT_BATCH + 1)]
    )
    reply = await bus.request("svc.session.connects", many.SerializeToString(), timeout=10)
    assert reply.headers and reply.headers["Starling-Error"].startswith(
        f"INVALID_ARGUMENT requests: at most {CONNECT_BATCH} per call"
    )
    assert InvalidArgumentError  # the status a gRPC caller gets for the same request


async def _seen(watch: Client, calls: list[str], at_least: int) -> None:
    """The spy's callbacks run in their own task after the messages arrive: a flush alone
    can return before they ran. Wait for `at_least` of them, then for any still under way."""
    await eventually(lambda: len(calls) >= at_least, 5, lambda: f"{at_least} calls: {calls}")
    await flushed(watch)
    await asyncio.sleep(0.05)


async def test_connects_asked_for_while_one_is_in_flight_go_together(
    core: Core, bus: Client, nats_url: str
) -> None:
    """CONNECTs arriving one per loop turn (as from separate sockets) while a call is in
    flight wait for it and then share one ConnectMany, instead of one call each."""
    calls: list[str] = []

    async def spy(msg: Msg) -> None:
        calls.append(msg.subject)

    watch = await nats.connect(nats_url)
    subs = [await watch.subscribe(f"svc.session.{s}", cb=spy) for s in ("connect", "connects")]
    await flushed(watch)
    session = SessionClient(core.session)
    session.use_bus(bus)
    prefix = uuid.uuid4().hex[:6]
    try:
        lone = await session.connect(attempt(f"{prefix}-lone", f"{OPEN_TENANT}/{prefix}"))
        assert lone.ok
        await _seen(watch, calls, 1)
        assert calls == ["svc.session.connect"]  # nothing in flight: at once, alone
        calls.clear()
        pending = []
        for i in range(20):  # one per loop turn
            one = attempt(f"{prefix}-{i}", f"{OPEN_TENANT}/{prefix}-{i}")
            pending.append(asyncio.ensure_future(session.connect(one)))
            await asyncio.sleep(0)
        outcomes = await asyncio.gather(*pending)
        assert all(o.ok for o in outcomes)
        await _seen(watch, calls, 2)
        # The first alone, the rest together: a few calls, not one per CONNECT (on a loaded
        # machine a loop turn can outlast CONNECT_LINGER_S, so they may go in several).
        assert 2 <= len(calls) <= 11, calls
        assert "svc.session.connects" in calls
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await watch.close()
        await session.close()
