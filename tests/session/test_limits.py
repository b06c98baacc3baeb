"""The session service's connection cap per tenant (mesh-wide, from the Redis registry) and
client id ownership, through `SessionClient` against a session service of its own (small
cap) beside the router and queue services of tests/inproc.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.common.connect import ConnectAttempt, ConnectOutcome
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals
from services.session.client import SessionAdminClient, SessionClient
from services.session.config import SessionSettings
from services.session.core import may_use
from services.session.main import SessionService
from tests.inproc import ADMIN_TOKEN, Core, serving

CAP = 3
SHARED = "sharedids"


@dataclass
class Svc:
    session: SessionClient
    admin: SessionAdminClient
    refusals: Refusals


@pytest.fixture(scope="module")
async def svc(
    core: Core, nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Svc]:
    settings = SessionSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("session-limits"),
        metrics_port=-1,
        node_id="session-limits",
        # Not the core's subject: this service must not answer other nodes' CONNECTs.
        session_subject="svc.session.limits",
        router_addr=core.router,
        queue_addr=core.queue,
        anonymous_tenants=["*"],
        max_connections_per_tenant=CAP,
        shared_client_id_tenants=[SHARED],
    )
    service = SessionService(settings)
    async with serving(service) as address:
        s = Svc(SessionClient(address), SessionAdminClient(address, ADMIN_TOKEN), Refusals())
        s.refusals = service._refusals
        yield s
        await s.session.close()
        await s.admin.close()


def attempt(
    username: str,
    client_id: str,
    password: bytes | None = None,
    clean_start: bool = True,
    session_expiry_s: int = 0,
) -> ConnectAttempt:
    return ConnectAttempt(
        client_id=client_id,
        username=username,
        password=password,
        node_id="node-lim",
        peer_address="127.0.0.1:50000",
        protocol_level=5,
        clean_start=clean_start,
        session_expiry_s=session_expiry_s,
    )


def tenant() -> str:
    return f"sl{uuid.uuid4().hex[:6]}"


async def connect(svc: Svc, a: ConnectAttempt) -> ConnectOutcome:
    return await svc.session.connect(a)


def test_ownership_rule() -> None:
    assert may_use("alice", "alice") and may_use(None, "bob") and may_use("", "")
    assert not may_use("alice", "bob")
    assert not may_use("alice", "")  # anonymous never takes a user's
    assert not may_use("", "alice")  # and a user never an anonymous client's


async def test_connections_per_tenant_are_capped_mesh_wide(svc: Svc) -> None:
    t, other = tenant(), tenant()
    held = [await connect(svc, attempt(f"{t}/u", f"c{i}")) for i in range(CAP)]
    assert all(o.ok for o in held)
    refused = await connect(svc, attempt(f"{t}/u", "one-too-many"))
    assert refused.reason_code == RC.QUOTA_EXCEEDED
    assert svc.refusals.get("connections_per_tenant", t) == 1
    # Taking over a connected client id adds no connection: still allowed at the cap.
    again = await connect(svc, attempt(f"{t}/u", "c0"))
    assert again.ok and again.epoch > held[0].epoch
    # Another tenant is not affected.
    assert (await connect(svc, attempt(f"{other}/u", "c0"))).ok
    # A connection that ends makes room.
    assert await svc.session.disconnect(t, "c1", held[1].epoch, "node-lim", 0, None)
    assert (await connect(svc, attempt(f"{t}/u", "one-too-many"))).ok
    assert (await connect(svc, attempt(f"{t}/u", "c9"))).reason_code == RC.QUOTA_EXCEEDED


async def test_another_user_cannot_take_over_a_client_id(svc: Svc) -> None:
    t = tenant()
    await svc.admin.create_user(t, "alice", "pw-a")
    await svc.admin.create_user(t, "bob", "pw-b")
    alice = attempt(f"{t}/alice", "dev-1", b"pw-a", clean_start=False, session_expiry_s=600)
    first = await connect(svc, alice)
    assert first.ok
    # Connected: bob may neither take over the connection nor start over the session.
    for clean in (False, True):
        bob = attempt(f"{t}/bob", "dev-1", b"pw-b", clean_start=clean, session_expiry_s=600)
        assert (await connect(svc, bob)).reason_code == RC.NOT_AUTHORIZED
    # Nor an anonymous client (the tenant lets them in), nor bob once alice left.
    anonymous = attempt(f"{t}/mallory", "dev-1")
    assert (await connect(svc, anonymous)).reason_code == RC.NOT_AUTHORIZED
    assert await svc.session.disconnect(
        t, "dev-1", first.epoch, "node-lim", first.incarnation, None
    )
    bob = attempt(f"{t}/bob", "dev-1", b"pw-b", clean_start=False, session_expiry_s=600)
    assert (await connect(svc, bob)).reason_code == RC.NOT_AUTHORIZED
    assert svc.refusals.get("client_id_owner", t) == 4
    # Alice resumes her session: bob's refusals did not disturb it.
    back = await connect(svc, alice)
    assert back.ok and back.session_present and back.incarnation == first.incarnation


async def test_anonymous_sessions_are_not_a_users_and_expired_ones_are_free(svc: Svc) -> None:
    t = tenant()
    await svc.admin.create_user(t, "carol", "pw")
    anon = await connect(svc, attempt(f"{t}/x", "anon-1", clean_start=False, session_expiry_s=1))
    assert anon.ok
    carol = attempt(f"{t}/carol", "anon-1", b"pw", clean_start=False, session_expiry_s=60)
    assert (await connect(svc, carol)).reason_code == RC.NOT_AUTHORIZED
    # Anonymous clients are one identity: another one may take it over.
    again = await connect(svc, attempt(f"{t}/y", "anon-1", clean_start=False, session_expiry_s=1))
    assert again.ok and again.session_present
    # Once the session has expired the client id is free for anyone.
    assert await svc.session.disconnect(t, "anon-1", again.epoch, "node-lim", again.incarnation, 0)
    got = await connect(svc, carol)
    assert got.ok and not got.session_present


async def test_a_tenant_may_share_client_ids(svc: Svc) -> None:
    await svc.admin.create_user(SHARED, "dave", "pw")
    cid = f"shared-{uuid.uuid4().hex[:6]}"
    first = await connect(svc, attempt(f"{SHARED}/x", cid, clean_start=False, session_expiry_s=60))
    assert first.ok
    dave = attempt(f"{SHARED}/dave", cid, b"pw", clean_start=False, session_expiry_s=60)
    taken = await connect(svc, dave)
    assert taken.ok and taken.session_present
