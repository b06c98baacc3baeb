"""SCRAM over the session service's Connect and Reauthenticate RPCs (the node's side of the
exchange, driven here with `SessionClient`), against the services in this process."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest

from services.common.config import ConfigError, load_settings
from services.common.connect import ConnectAttempt, ConnectOutcome, ReauthAttempt
from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.errors import InvalidArgumentError
from services.session.client import SessionAdminClient, SessionClient
from services.session.config import SessionSettings
from tests.inproc import ADMIN_TOKEN, Core
from tests.scram_client import ScramClient


@pytest.fixture
async def clients(core: Core) -> AsyncIterator[tuple[SessionClient, SessionAdminClient]]:
    session, admin = SessionClient(core.session), SessionAdminClient(core.session, ADMIN_TOKEN)
    yield session, admin
    await session.close()
    await admin.close()


def attempt(username: str, method: str = "", data: bytes = b"", **kw: object) -> ConnectAttempt:
    fields: dict[str, object] = {
        "client_id": f"c-{uuid.uuid4().hex[:6]}",
        "username": username,
        "password": None,
        "node_id": "node-ea",
        "peer_address": f"10.9.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}:1",
        "protocol_level": 5,
        "clean_start": True,
        "session_expiry_s": 0,
        "auth_method": method,
        "auth_data": data,
    }
    fields.update(kw)
    return ConnectAttempt(**fields)  # type: ignore[arg-type]


async def scram_connect(
    session: SessionClient, mechanism: str, username: str, password: str, scram_name: str = ""
) -> tuple[ConnectOutcome, ScramClient]:
    client = ScramClient(mechanism, scram_name, password)
    first = attempt(username, mechanism, client.first())
    step = await session.connect(first)
    assert step.auth_continue and step.auth_data, step
    final = dataclasses.replace(
        first, auth_data=client.final(step.auth_data), auth_state=step.auth_state
    )
    return await session.connect(final), client


def tenant() -> str:
    return f"ea{uuid.uuid4().hex[:6]}"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_connect_and_wrong_password(
    clients: tuple[SessionClient, SessionAdminClient], mechanism: str
) -> None:
    session, admin = clients
    t = tenant()
    await admin.create_user(t, "dev", "s3cret")
    ok, client = await scram_connect(session, mechanism, f"{t}/dev", "s3cret")
    assert ok.ok and ok.tenant == t and ok.identity == f"{t}/dev"
    assert ok.auth_data is not None and client.verify(ok.auth_data)  # server proved itself
    bad, _ = await scram_connect(session, mechanism, f"{t}/dev", "guess")
    assert bad.reason_code == RC.NOT_AUTHORIZED
    # An unknown user runs the same exchange and fails at the same point.
    ghost, _ = await scram_connect(session, mechanism, f"{t}/ghost", "s3cret")
    assert ghost.reason_code == RC.NOT_AUTHORIZED
    # No MQTT user name: the SCRAM user name says who.
    named, _ = await scram_connect(session, mechanism, "", "s3cret", scram_name=f"{t}/dev")
    assert named.ok and named.identity == f"{t}/dev"


async def test_unknown_method_and_scram_only_users(
    clients: tuple[SessionClient, SessionAdminClient],
) -> None:
    session, admin = clients
    t = tenant()
    out = await session.connect(attempt(f"{t}/dev", "PLAIN", b"x"))
    assert out.reason_code == RC.BAD_AUTHENTICATION_METHOD
    await admin.create_user(t, "only", "pw", credentials=["scram-sha-256"])
    plain = await session.connect(attempt(f"{t}/only", password=b"pw"))
    assert plain.reason_code == RC.BAD_USER_NAME_OR_PASSWORD
    ok, _ = await scram_connect(session, "SCRAM-SHA-256", f"{t}/only", "pw")
    assert ok.ok
    none512, _ = await scram_connect(session, "SCRAM-SHA-512", f"{t}/only", "pw")
    assert none512.reason_code == RC.NOT_AUTHORIZED


async def test_reauthentication_proves_the_same_user(
    clients: tuple[SessionClient, SessionAdminClient],
) -> None:
    session, admin = clients
    t = tenant()
    await admin.create_user(t, "dev", "pw")
    await admin.create_user(t, "eve", "evil")
    mech = "SCRAM-SHA-256"

    async def reauth(identity: str, scram_name: str, password: str) -> ConnectOutcome:
        client = ScramClient(mech, scram_name, password)
        base = ReauthAttempt(
            tenant=t,
            identity=identity,
            client_id="c",
            peer_address="10.8.0.1:1",
            auth_method=mech,
            auth_data=client.first(),
        )
        step = await session.reauthenticate(base)
        assert step.auth_continue and step.auth_data
        final = dataclasses.replace(
            base, auth_data=client.final(step.auth_data), auth_state=step.auth_state
        )
        return await session.reauthenticate(final)

    done = await reauth(f"{t}/dev", "", "pw")
    assert done.ok and done.auth_data and done.auth_data.startswith(b"v=")
    assert (await reauth(f"{t}/dev", "", "nope")).reason_code == RC.NOT_AUTHORIZED
    # Eve's own password, claiming to be Eve in SCRAM, on dev's connection: refused.
    assert (await reauth(f"{t}/dev", f"{t}/eve", "evil")).reason_code == RC.NOT_AUTHORIZED


async def test_bad_credential_kinds_are_an_invalid_argument(
    clients: tuple[SessionClient, SessionAdminClient],
) -> None:
    _, admin = clients
    with pytest.raises(InvalidArgumentError, match="credentials"):
        await admin.create_user(tenant(), "dev", "pw", credentials=["md5"])


def test_a_chain_naming_an_unconfigured_authenticator_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="jwt_secret"):
        load_settings(SessionSettings, auth_chain={"*": ["jwt"]})
    with pytest.raises(ConfigError, match="http_auth_url"):
        load_settings(SessionSettings, auth_chain={"acme": ["http", "password"]})
