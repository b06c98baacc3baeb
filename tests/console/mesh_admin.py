"""Set-up through the admin APIs for the console tests (users, tenant tokens), with the
operator token: synchronous wrappers over the typed admin clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from services.session.client import SessionAdminClient
from services.session.token_client import TokenAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho

T = TypeVar("T")


def run(go: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a loop of its own thread (Playwright's sync API
    keeps an event loop running on the test's thread)."""

    async def main() -> T:
        return await go()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def new_tenant(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def add_user(mesh: MeshInfo, tenant: str, user: str, password: str) -> None:
    async def go() -> None:
        c = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            await c.create_user(tenant, user, password)
        finally:
            await c.close()

    run(go)


def tenant_token(mesh: MeshInfo, tenant: str) -> str:
    async def go() -> str:
        c = TokenAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            return (await c.create(tenant, 3600, "console test"))[1]
        finally:
            await c.close()

    return run(go)


def connected(mesh: MeshInfo, tenant: str, client_id: str, node: int = 0) -> Paho:
    """A paho client of `tenant` (user `u`, created here), connected."""
    add_user(mesh, tenant, "u", "pw")
    c = Paho(mesh.node(node), client_id=client_id, username=f"{tenant}/u", password="pw")
    c.connect()
    return c
