"""The session clients against the session, router and queue services in this process
(tests/inproc.py): CONNECT answers as `ConnectOutcome`s with MQTT
reason codes, resumed sessions with their subscriptions, the admin API with domain types."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.common.acl import Access, AclRule
from services.common.connect import ConnectAttempt, ConnectOutcome
from services.common.mqtt.packets import Subscription
from services.common.rpc.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from services.common.store.ports_session import Qos2Change, Qos2Update
from services.router.client import RouterClient
from services.session.client import (
    ClientInfo,
    SessionAdminClient,
    SessionClient,
    connect_outcome,
)
from starling.session.v1 import session_pb2 as pb
from tests.inproc import ADMIN_TOKEN, OPEN_TENANT, Core


@dataclass
class Mesh:
    address: str  # the session service's
    session: SessionClient
    admin: SessionAdminClient
    router: RouterClient


@pytest.fixture
async def mesh(core: Core) -> AsyncIterator[Mesh]:
    m = Mesh(
        core.session,
        SessionClient(core.session),
        SessionAdminClient(core.session, ADMIN_TOKEN),
        RouterClient(core.router),
    )
    yield m
    for c in (m.session, m.admin, m.router):
        await c.close()


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
        node_id="node-st",
        peer_address="127.0.0.1:50000",
        protocol_level=5,
        clean_start=clean_start,
        session_expiry_s=session_expiry_s,
    )


def tenant() -> str:
    return f"st{uuid.uuid4().hex[:6]}"


async def test_connect_answers_with_reason_codes_and_acl(mesh: Mesh) -> None:
    t = tenant()
    await mesh.admin.create_user(t, "alice", "pw")
    await mesh.admin.set_acl(
        t,
        [
            AclRule(True, Access.PUBLISH, "dev/%c/#"),
            AclRule(False, Access.SUBSCRIBE, "private/#", username="alice"),
            AclRule(False, Access.ALL, "#", username="bob"),
        ],
    )
    ok = await mesh.session.connect(attempt(f"{t}/alice", "c1", b"pw"))
    assert isinstance(ok, ConnectOutcome) and ok.ok
    assert (ok.tenant, ok.taken_over, ok.session_present, ok.session_expiry_s) == (
        t,
        False,
        False,
        0,
    )
    assert ok.epoch > 0 and ok.acl_default_allow
    assert ok.acl == (  # %c substituted; only the rules for this user
        AclRule(True, Access.PUBLISH, "dev/c1/#"),
        AclRule(False, Access.SUBSCRIBE, "private/#"),
    )
    refusals = [
        attempt(f"{t}/alice", "c2", b"wrong"),  # bad password
        attempt(f"{t}/alice", "c2"),  # no password for a known user
        attempt("bad tenant/alice", "c2", b"pw"),  # not a tenant name
        attempt(f"{t}/nobody", "c2", b"pw"),  # unknown user, no anonymous access
        attempt("", "c2"),  # anonymous in "default", which does not allow it
        attempt(f"{OPEN_TENANT}/anyone", ""),  # no client id
    ]
    codes = [(await mesh.session.connect(a)).reason_code for a in refusals]
    assert codes == [0x86, 0x86, 0x86, 0x86, 0x87, 0x85]


async def test_a_resumed_session_ignores_qos2_records_its_earlier_connection_writes_late(
    mesh: Mesh,
) -> None:
    """A node gave connection 1 up while one of its QoS 2 records was under way; the record
    lands after connection 2 resumed the session and released the same packet id. Taken,
    connection 3 would find id 5 'received' and take the client's next message under id 5
    for a resend of a message that was never routed."""
    cid = f"q2-{uuid.uuid4().hex[:6]}"

    async def connect() -> ConnectOutcome:
        out = await mesh.session.connect(
            attempt(f"{OPEN_TENANT}/u", cid, clean_start=False, session_expiry_s=60)
        )
        assert out.ok
        return out

    def update(conn: ConnectOutcome, change: str, pid: int, mid: str = "") -> Qos2Update:
        return Qos2Update(OPEN_TENANT, cid, conn.incarnation, change, pid, mid, conn.qos2_fence)

    first = await connect()
    await mesh.session.record_qos2([update(first, Qos2Change.RECEIVED, 5, "m-first")])
    second = await connect()  # takes the session over from the first
    assert second.session_present and second.awaiting_release == ((5, "m-first", False),)
    await mesh.session.record_qos2([update(second, Qos2Change.RELEASED, 5)])
    # The first connection's late writes.
    await mesh.session.record_qos2(
        [
            update(first, Qos2Change.RECEIVED, 5, "m-late"),
            update(first, Qos2Change.RECEIVED, 6, "x"),
        ]
    )
    await mesh.session.record_qos2([update(second, Qos2Change.RECEIVED, 7, "m-second")])
    third = await connect()
    assert third.awaiting_release == ((7, "m-second", False),)


async def test_a_persistent_session_resumes_with_its_subscriptions(mesh: Mesh) -> None:
    cid = f"dur-{uuid.uuid4().hex[:6]}"
    first = await mesh.session.connect(
        attempt(f"{OPEN_TENANT}/u", cid, clean_start=False, session_expiry_s=60)
    )
    assert first.ok and not first.session_present and first.session_expiry_s == 60
    subs = [
        (Subscription("a/+", 1, no_local=True, retain_handling=1), 7),
        (Subscription("b/#", 2, retain_as_published=True), None),
    ]
    await mesh.router.subscribe(OPEN_TENANT, cid, first.incarnation, subs)
    assert await mesh.session.disconnect(
        OPEN_TENANT, cid, first.epoch, "node-st", first.incarnation, None
    )
    assert not await mesh.session.disconnect(  # released already: nothing to release
        OPEN_TENANT, cid, first.epoch, "node-st", first.incarnation, None
    )

    back = await mesh.session.connect(
        attempt(f"{OPEN_TENANT}/u", cid, clean_start=False, session_expiry_s=60)
    )
    assert back.ok and back.session_present
    assert (back.incarnation, back.epoch > first.epoch) == (first.incarnation, True)
    assert sorted(back.subscriptions, key=lambda s: s[0].filter) == subs

    fresh = await mesh.session.connect(attempt(f"{OPEN_TENANT}/u", cid, clean_start=True))
    assert fresh.ok and not fresh.session_present and fresh.subscriptions == ()
    assert fresh.incarnation != first.incarnation


async def test_admin_users_acl_clients_and_kick(mesh: Mesh) -> None:
    t = tenant()
    await mesh.admin.create_user(t, "ops", "pw")
    rules = [AclRule(True, Access.ALL, "fleet/%u/#", client_id="c9")]
    await mesh.admin.set_acl(t, rules)
    assert await mesh.admin.get_acl(t) == rules
    with pytest.raises(InvalidArgumentError, match=r"rules\[1\]\.topic_filter"):
        await mesh.admin.set_acl(t, [*rules, AclRule(True, Access.PUBLISH, "a/#/b")])
    with pytest.raises(InvalidArgumentError, match="tenant"):
        await mesh.admin.get_acl("no such tenant")

    ok = await mesh.session.connect(attempt(f"{t}/ops", "c9", b"pw"))
    (info,) = await mesh.admin.list_clients(t)
    assert isinstance(info, ClientInfo)
    assert (info.tenant, info.client_id, info.username, info.node_id, info.epoch) == (
        t,
        "c9",
        "ops",
        "node-st",
        ok.epoch,
    )
    assert (info.peer_address, info.protocol_level, info.clean_start) == (
        "127.0.0.1:50000",
        5,
        True,
    )
    await mesh.admin.kick(t, "c9")
    with pytest.raises(NotFoundError, match="c10"):
        await mesh.admin.kick(t, "c10")

    assert await mesh.admin.delete_user(t, "ops") is True
    assert await mesh.admin.delete_user(t, "ops") is False
    wrong = SessionAdminClient(mesh.address, "wrong")
    with pytest.raises(PermissionDeniedError):
        await wrong.list_clients(t)
    await wrong.close()


def test_every_connect_result_has_its_outcome() -> None:
    taken = connect_outcome(
        pb.ConnectResponse(result=pb.CONNECT_RESULT_TAKEN_OVER, tenant="t", epoch=9)
    )
    assert (taken.ok, taken.taken_over, taken.tenant, taken.epoch) == (True, True, "t", 9)
    busy = connect_outcome(pb.ConnectResponse(result=pb.CONNECT_RESULT_SERVER_BUSY))
    assert (busy.ok, busy.reason_code) == (False, 0x89)
    unknown = connect_outcome(pb.ConnectResponse())  # UNSPECIFIED: refused, not authorized
    assert (unknown.ok, unknown.reason_code) == (False, 0x87)
    deny = connect_outcome(
        pb.ConnectResponse(result=pb.CONNECT_RESULT_OK, acl_default=pb.PERMISSION_DENY)
    )
    assert deny.ok and not deny.acl_default_allow
