"""A change of an ACL or a user made through one session instance reaches the copies the
other instances keep in their processes (services/session/auth.py announces it on NATS):
two session services of their own, in-process copies kept far longer than the test runs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest

from services.common.acl import Access, AclRule
from services.common.connect import ConnectAttempt
from services.session.client import SessionAdminClient, SessionClient
from services.session.config import SessionSettings
from services.session.main import SessionService
from tests.inproc import ADMIN_TOKEN, Core, serving
from tests.poll import eventually

LONG_S = 3600.0  # in-process copies outlive the test: only an announcement refreshes them


@dataclass(frozen=True)
class Pair:
    a: SessionAdminClient
    b: SessionAdminClient
    b_session: SessionClient


@pytest.fixture(scope="module")
async def pair(
    core: Core, nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pair]:
    async with AsyncExitStack() as stack:
        addresses = []
        data_dir = tmp_path_factory.mktemp("auth-changes")  # one store, as two instances share
        for name in ("a", "b"):
            settings = SessionSettings(
                nats_url=nats_url,
                redis_url=redis_url,
                data_dir=data_dir,
                metrics_port=-1,
                node_id=f"session-changes-{name}",
                # Not the core's subject: these must not answer other nodes' CONNECTs.
                session_subject=f"svc.session.changes.{name}",
                router_addr=core.router,
                queue_addr=core.queue,
                auth_local_cache_ttl_s=LONG_S,
            )
            addresses.append(await stack.enter_async_context(serving(SessionService(settings))))
        pair = Pair(
            SessionAdminClient(addresses[0], ADMIN_TOKEN),
            SessionAdminClient(addresses[1], ADMIN_TOKEN),
            SessionClient(addresses[1]),
        )
        yield pair
        await pair.a.close()
        await pair.b.close()
        await pair.b_session.close()


def _rule(topic_filter: str) -> AclRule:
    return AclRule(allow=True, access=Access.ALL, topic_filter=topic_filter)


async def test_an_acl_set_on_one_instance_is_what_the_other_answers(pair: Pair) -> None:
    tenant = f"ac{uuid.uuid4().hex[:6]}"
    await pair.a.set_acl(tenant, [_rule("first/#")])
    assert await pair.b.get_acl(tenant) == [_rule("first/#")]  # now copied in b's process
    await pair.a.set_acl(tenant, [_rule("second/#")])

    async def b_sees_the_change() -> bool:
        return await pair.b.get_acl(tenant) == [_rule("second/#")]

    await eventually(b_sees_the_change)


async def test_a_user_deleted_on_one_instance_cannot_log_in_on_the_other(pair: Pair) -> None:
    tenant = f"ac{uuid.uuid4().hex[:6]}"
    await pair.a.create_user(tenant, "dev", "pw")
    attempt = ConnectAttempt(
        client_id="c1",
        username=f"{tenant}/dev",
        password=b"pw",
        node_id="node-changes",
        peer_address="127.0.0.1:50000",
        protocol_level=5,
        clean_start=True,
        session_expiry_s=0,
    )
    assert (await pair.b_session.connect(attempt)).ok  # b keeps the user's hash
    assert await pair.a.delete_user(tenant, "dev")

    async def b_refuses() -> bool:
        return not (await pair.b_session.connect(attempt)).ok

    await eventually(b_refuses)
