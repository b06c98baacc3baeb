"""The mesh interest summary (services/connection/interest.py), end to end on the two-node
mesh: a tenant nobody listens to on another node costs no NATS traffic, and a subscriber
that appears on another node gets every message published after its SUBACK."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus.flushing import flushed
from services.common.mqtt import ConnAck, Connect, Publish, SubAck, Subscribe, Subscription
from services.common.topics.subject import escape_token
from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Raw
from tests.poll import eventually


@pytest.fixture(scope="module")
def admin(mesh: MeshInfo) -> Admin:
    return Admin(mesh)


def _client(mesh: MeshInfo, node: int, tenant: str, name: str) -> Raw:
    raw = Raw(mesh.node(node), level=4)
    ack = raw.connect(Connect(name, 4, username=f"{tenant}/u", password=b"pw"))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def _publishes(raw: Raw, within: float) -> list[bytes]:
    """Payloads of the PUBLISHes that arrive until `within` seconds pass without one."""
    out: list[bytes] = []
    while True:
        try:
            p = raw.recv(timeout=within)
        except TimeoutError:
            return out
        if isinstance(p, Publish):
            out.append(p.payload)


def test_a_subscriber_on_another_node_gets_everything_after_its_suback(
    mesh: MeshInfo, admin: Admin
) -> None:
    """The publisher's node skips NATS for the tenant until the other node announces the
    tenant; the SUBACK waits for that, so no message sent after it is missed. Each round
    takes a fresh tenant, published to without pause while the subscriber subscribes."""
    for _ in range(3):
        tenant = f"mi{uuid.uuid4().hex[:8]}"
        admin.user(tenant, "u", "pw")
        pub = _client(mesh, 0, tenant, "pub")
        sub = _client(mesh, 1, tenant, "sub")
        for i in range(200):  # no subscriber anywhere yet: node 0 learns it may skip
            pub.send(Publish("x/t", b"warm%d" % i))
        time.sleep(0.5)
        sub.send(Subscribe(1, (Subscription("x/t", 0),)))
        sent_before_suback = -1
        n = 0
        got: list[bytes] = []
        while sent_before_suback < 0 or n < sent_before_suback + 300:
            pub.send(Publish("x/t", b"%d" % n))
            n += 1
            try:
                p = sub.recv(timeout=0.001)
            except TimeoutError:
                continue
            if isinstance(p, SubAck):
                sent_before_suback = n  # messages from here on were sent after the SUBACK
            elif isinstance(p, Publish):
                got.append(p.payload)
            assert n < 100_000, "no SUBACK"
        got += _publishes(sub, 1.0)
        numbers = {int(x) for x in got if not x.startswith(b"warm")}
        missing = [i for i in range(sent_before_suback, n) if i not in numbers]
        assert not missing, f"{len(missing)} of {n - sent_before_suback} missed: {missing[:10]}"
        for c in (pub, sub):
            c.close()


@contextlib.asynccontextmanager
async def _watching(mesh: MeshInfo, tenant: str) -> AsyncIterator[tuple[list[str], Client]]:
    """What the tenant's mesh subjects carry, seen by the operator's NATS user (which
    announces no interest)."""
    url = f"nats://operator:{mesh.launcher.secrets.nats['operator']}@127.0.0.1:"
    nc = await nats.connect(url + str(mesh.mesh.by_name("nats").port))
    seen: list[str] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(msg.subject)

    await nc.subscribe(f"mq.{escape_token(tenant)}.>", cb=on_msg)
    await flushed(nc)
    try:
        yield seen, nc
    finally:
        await nc.close()


async def _until_skipped(seen: list[str], nc: Client, pub: Raw, local: Raw) -> None:
    """A node trusts what it knows of the others only while it is confirmed (and not right
    after a hiccup): publish rounds of 20 until one stays off NATS."""
    loop = asyncio.get_running_loop()

    async def a_round_off_nats() -> bool:
        before = len(seen)
        for i in range(20):
            pub.send(Publish("x/1", b"%d" % i))
        got = await loop.run_in_executor(None, _publishes, local, 0.3)
        await flushed(nc)
        assert len(got) == 20  # delivered on node 0 all the same
        return len(seen) == before

    await eventually(
        a_round_off_nats, 15, lambda: f"a round off NATS; {len(seen)} went on NATS", every_s=0
    )


async def test_a_tenant_without_listeners_elsewhere_puts_nothing_on_nats(
    mesh: MeshInfo, admin: Admin
) -> None:
    tenant = f"mi{uuid.uuid4().hex[:8]}"
    admin.user(tenant, "u", "pw")
    async with _watching(mesh, tenant) as (seen, nc):
        loop = asyncio.get_running_loop()
        pub = await loop.run_in_executor(None, _client, mesh, 0, tenant, "pub")
        local = await loop.run_in_executor(None, _client, mesh, 0, tenant, "local")
        try:
            local.send(Subscribe(1, (Subscription("x/#", 0),)))
            assert isinstance(await loop.run_in_executor(None, local.recv), SubAck)
            await _until_skipped(seen, nc, pub, local)
            # A subscriber on node 1: from its SUBACK on, the tenant goes on NATS again.
            remote = await loop.run_in_executor(None, _client, mesh, 1, tenant, "remote")
            remote.send(Subscribe(1, (Subscription("x/#", 0),)))
            assert isinstance(await loop.run_in_executor(None, remote.recv), SubAck)
            pub.send(Publish("x/1", b"after"))
            got = await loop.run_in_executor(None, _publishes, remote, 0.5)
            assert got == [b"after"]
            assert seen, "nothing on NATS for a tenant another node listens to"
            remote.close()
        finally:
            for c in (pub, local):
                c.close()


async def test_a_shared_subscriber_on_the_publishers_node_still_gets_its_messages(
    mesh: MeshInfo, admin: Admin
) -> None:
    """Shared groups are served through NATS queue groups, this node's members too: a
    tenant with a shared subscription here goes on NATS though no other node listens."""
    tenant = f"mi{uuid.uuid4().hex[:8]}"
    admin.user(tenant, "u", "pw")
    async with _watching(mesh, tenant) as (seen, nc):
        loop = asyncio.get_running_loop()
        pub = await loop.run_in_executor(None, _client, mesh, 0, tenant, "pub")
        local = await loop.run_in_executor(None, _client, mesh, 0, tenant, "local")
        member = await loop.run_in_executor(None, _client, mesh, 0, tenant, "member")
        try:
            local.send(Subscribe(1, (Subscription("x/#", 0),)))
            assert isinstance(await loop.run_in_executor(None, local.recv), SubAck)
            await _until_skipped(seen, nc, pub, local)
            member.send(Subscribe(1, (Subscription("$share/g/s/#", 0),)))
            assert isinstance(await loop.run_in_executor(None, member.recv), SubAck)
            for i in range(20):
                pub.send(Publish("s/1", b"%d" % i))
            got = await loop.run_in_executor(None, _publishes, member, 1.0)
            assert sorted(int(x) for x in got) == list(range(20))
        finally:
            for c in (pub, local, member):
                c.close()
