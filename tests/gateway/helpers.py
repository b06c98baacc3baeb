"""What the gateway tests share: users and tokens made through the admin clients, an MQTT
subscriber, and the HTTP and CoAP clients (aiohttp, aiocoap) pointed at the mesh's gateway."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import aiohttp

from services.session.client import SessionAdminClient
from services.session.token_client import TokenAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def add_user(mesh: MeshInfo, tenant: str, name: str, password: str) -> None:
    admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
    try:
        await admin.create_user(tenant, name, password, hash_scheme="bcrypt")
    finally:
        await admin.close()


async def tenant_token(mesh: MeshInfo, tenant: str) -> str:
    tokens = TokenAdminClient(mesh.addr("session"), ADMIN_TOKEN)
    try:
        _, token = await tokens.create(tenant, 3600, "gateway tests")
    finally:
        await tokens.close()
    return token


def basic(username: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def subscriber(mesh: MeshInfo, node: int, username: str, password: str, filt: str) -> Paho:
    """A connected MQTT 5 client of `username`, subscribed to `filt` at QoS 1."""
    sub = Paho(mesh.node(node), username=username, password=password)
    sub.connect()
    sub.subscribe(filt, 1)
    return sub


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with http.post(url, json=body, headers=headers) as resp:
        try:
            answer = await resp.json(content_type=None)
        except ValueError:
            answer = await resp.text()
        return resp.status, answer, resp
