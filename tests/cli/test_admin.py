"""The admin commands over the admin clients, against the core services in this process:
what `starling <command>` prints (JSON with the field names of the API) and how errors read."""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from services.cli.admin import ROUTER_COMMANDS, admin_command
from services.cli.main import build_parser
from services.common.connect import ConnectAttempt
from services.common.mqtt.packets import Subscription
from services.metrics.client import MetricsClient, TenantCounters
from services.router.client import RouterClient
from services.session.client import SessionClient
from starling.common.v1.message_pb2 import MessageProperties, Publisher, RoutedMessage
from tests.inproc import ADMIN_TOKEN, Core


async def starling(core: Core, *argv: str, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
    """Exit status and the printed JSON (or the error line); the token comes from a file."""
    folder = Path(tempfile.mkdtemp())
    (folder / "token").write_text(token + "\n")
    extra = ["--session-addr", core.session, "--token-file", str(folder / "token")]
    if argv[0] in ROUTER_COMMANDS:
        extra += ["--router-addr", core.router]
    if argv[0] == "stats":
        extra += ["--metrics-addr", core.metrics]
    status, text = await admin_command(parser().parse_args([*argv, *extra]))
    return status, json.loads(text) if status == 0 else text


def parser() -> argparse.ArgumentParser:
    """The CLI's parser as an admin command gets it (analytics without its Spark jobs)."""
    return build_parser("clients")


def tenant() -> str:
    return f"cli{uuid.uuid4().hex[:6]}"


async def test_users_and_acl(core: Core, tmp_path: Path) -> None:
    t = tenant()
    assert await starling(
        core, "user-add", "--tenant", t, "--username", "ops", "--password", "pw"
    ) == (0, {})
    rules = [  # as docs/clients.md writes them
        {"permission": "PERMISSION_ALLOW", "action": "ACL_ACTION_PUBLISH", "topic_filter": "d/%c"},
        {"permission": "PERMISSION_DENY", "action": "ACL_ACTION_ALL", "topic_filter": "#",
         "username": "guest"},
    ]  # fmt: skip
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(rules))
    assert await starling(core, "acl-set", "--tenant", t, "--file", str(path)) == (0, {})
    assert await starling(core, "acl-get", "--tenant", t) == (0, {"rules": rules})

    path.write_text(json.dumps([{**rules[0], "permission": "ALLOW"}]))
    status, line = await starling(core, "acl-set", "--tenant", t, "--file", str(path))
    assert status == 1
    assert line.startswith("starling acl-set: INVALID_ARGUMENT: rules[0].permission must be")
    path.write_text(json.dumps([{**rules[0], "topic_filter": "a/#/b"}]))
    status, line = await starling(core, "acl-set", "--tenant", t, "--file", str(path))
    assert status == 1 and "INVALID_ARGUMENT: rules[0].topic_filter" in line
    status, line = await starling(core, "acl-get", "--tenant", "no such tenant")
    assert status == 1 and "INVALID_ARGUMENT" in line

    assert await starling(core, "user-delete", "--tenant", t, "--username", "ops") == (
        0,
        {"deleted": True},
    )


async def test_clients_and_kick(core: Core) -> None:
    t = tenant()
    await starling(core, "user-add", "--tenant", t, "--username", "u", "--password", "pw")
    session = SessionClient(core.session)
    ok = await session.connect(
        ConnectAttempt(
            client_id="c1",
            username=f"{t}/u",
            password=b"pw",
            node_id="node-cli",
            peer_address="10.0.0.1:1234",
            protocol_level=4,
            clean_start=True,
            session_expiry_s=0,
        )
    )
    await session.close()
    status, out = await starling(core, "clients", "--tenant", t)
    assert status == 0
    (client,) = out["clients"]
    assert client | {"connected_at_ms": 0} == {
        "tenant": t,
        "client_id": "c1",
        "username": "u",
        "node_id": "node-cli",
        "peer_address": "10.0.0.1:1234",
        "protocol_level": 4,
        "connected_at_ms": 0,
        "epoch": ok.epoch,
        "clean_start": True,
    }
    assert await starling(core, "kick", "--tenant", t, "--client-id", "c1") == (
        0,
        {"kicked": True},
    )
    status, line = await starling(core, "kick", "--tenant", t, "--client-id", "c2")
    assert status == 1 and line.startswith("starling kick: NOT_FOUND: client 'c2'")


def _published(t: str, topic: str, now_ms: int, retain: bool = False) -> RoutedMessage:
    """A QoS 1 message of tenant `t` as a node hands it to the router."""
    return RoutedMessage(
        tenant=t,
        topic=topic,
        payload=b"up",
        qos=1,
        retain=retain,
        publisher=Publisher(client_id="pub"),
        published_at_ms=now_ms,
        message_id=uuid.uuid4().hex,
        properties=MessageProperties(content_type="text/plain"),
    )


async def test_routes_retained_and_delayed(core: Core) -> None:
    t = tenant()
    router = RouterClient(core.router)
    await router.subscribe(t, "dur", 4, [(Subscription("fleet/#", 1), None)])
    now_ms = int(time.time() * 1000)
    retained = _published(t, "status/a", now_ms, retain=True)
    await router.route([retained, _published(t, "$delayed/60/later", now_ms)])
    await router.close()

    status, out = await starling(core, "routes", "--tenant", t)
    assert (status, out) == (
        0,
        {"routes": [{"topic_filter": "fleet/#", "node_ids": ["dur#4"], "persistent": True}]},
    )
    status, out = await starling(core, "retained", "--tenant", t, "--filter", "status/#")
    assert status == 0 and (out["stored"], out["examined"] > 0) == (1, True)
    (msg,) = out["messages"]
    assert msg == {
        "tenant": t,
        "topic": "status/a",
        "payload": base64.b64encode(b"up").decode(),
        "qos": 1,
        "retain": True,
        "publisher": "pub",
        "properties": {"content_type": "text/plain"},
        "published_at": now_ms / 1000,
        "trace_context": [],
        "packet_id": 0,
        "message_id": "",
    }
    status, out = await starling(core, "delayed", "--tenant", t)
    (delayed,) = out["messages"]
    assert delayed["message"]["topic"] == "later" and delayed["due_ms"] > now_ms
    assert await starling(core, "cancel-delayed", "--tenant", t, "--id", delayed["id"]) == (
        0,
        {"cancelled": True},
    )
    status, line = await starling(core, "cancel-delayed", "--tenant", t, "--id", delayed["id"])
    assert status == 1 and line.startswith("starling cancel-delayed: NOT_FOUND")
    assert await starling(core, "delete-retained", "--tenant", t, "--topic", "status/a") == (
        0,
        {"deleted": True},
    )


async def test_stats(core: Core) -> None:
    t = tenant()
    metrics = MetricsClient(core.metrics)
    await metrics.report("node-cli", [TenantCounters(tenant=t, connections=2, messages_in=5)])
    await metrics.close()
    status, out = await starling(core, "stats")
    assert status == 0 and out["nodes"] >= 1
    got = {x["tenant"]: x for x in out["tenants"]}[t]
    assert got["connections"] == 2 and got["messages_in"] == 5
    assert got["messages_out"] == got["messages_dropped"] == got["msgs_in_q1"] == 0


@pytest.mark.parametrize("command", ["clients", "routes", "stats"])
async def test_a_wrong_token_reads_unauthenticated(core: Core, command: str) -> None:
    assert await starling(core, command, token="wrong") == (
        1,
        f"starling {command}: UNAUTHENTICATED: admin token missing or wrong",
    )


def test_the_token_is_never_taken_from_argv(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["clients", "--token", "s3cret"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--token is no longer accepted" in err and "STARLING_ADMIN_TOKEN" in err


async def test_token_sources(core: Core, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STARLING_ADMIN_TOKEN wins over the file; the default file is the data dir's; an
    explicit file that cannot be read is an error that names it."""
    base = ["clients", "--session-addr", core.session]
    monkeypatch.delenv("STARLING_ADMIN_TOKEN", raising=False)
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "admin-token").write_text(ADMIN_TOKEN + "\n")
    args = parser().parse_args([*base, "--data-dir", str(tmp_path)])
    assert (await admin_command(args))[0] == 0
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", "wrong")
    status, line = await admin_command(args)
    assert (status, line) == (1, "starling clients: UNAUTHENTICATED: admin token missing or wrong")
    monkeypatch.delenv("STARLING_ADMIN_TOKEN")
    missing = str(tmp_path / "nope")
    status, line = await admin_command(parser().parse_args([*base, "--token-file", missing]))
    assert status == 2 and line.startswith(f"starling clients: cannot read --token-file {missing}")


async def test_tenant_tokens_from_the_cli(core: Core) -> None:
    """Create, list and revoke; a tenant token administers its tenant only and cannot manage
    tokens; after revocation it is refused."""
    t, other = tenant(), tenant()
    status, made = await starling(
        core, "admin", "token", "create", "--tenant", t, "--ttl", "2h", "--description", "ci"
    )
    assert status == 0 and made["tenant"] == t and made["token"].startswith("stk_")
    assert made["expires_at_ms"] - made["created_at_ms"] == 2 * 3600 * 1000
    status, listed = await starling(core, "admin", "token", "list", "--tenant", t)
    assert listed["tokens"] == [{k: v for k, v in made.items() if k != "token"}]
    assert made["token"] not in json.dumps(listed)

    scoped = made["token"]
    assert (await starling(core, "clients", "--tenant", t, token=scoped)) == (0, {"clients": []})
    status, line = await starling(core, "clients", "--tenant", other, token=scoped)
    assert (status, line) == (
        1,
        f"starling clients: PERMISSION_DENIED: token {made['token_id']} administers tenant "
        f"{t!r}, not {other!r}",
    )
    status, line = await starling(core, "admin", "token", "list", token=scoped)
    assert status == 1 and "PERMISSION_DENIED" in line and "operator token" in line

    status, line = await starling(core, "admin", "token", "create", "--tenant", t, "--ttl", "400d")
    assert status == 1 and "INVALID_ARGUMENT: ttl_s must be" in line
    assert "admin_token_max_ttl_s" in line
    assert await starling(core, "admin", "token", "revoke", made["token_id"]) == (
        0,
        {"revoked": True},
    )
    status, line = await starling(core, "clients", "--tenant", t, token=scoped)
    assert (status, line) == (
        1,
        "starling clients: UNAUTHENTICATED: admin token missing, wrong, expired or revoked",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["retained", "--tenant", "acme", "--limit", "-5"],
        ["retained", "--tenant", "acme", "--limit", "0"],
        ["rules", "dlq", "list", "hot", "--tenant", "acme", "--limit", "1001"],
    ],
)
def test_a_bad_limit_is_refused_by_name(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--limit" in err and "a whole number from 1 to 1000" in err


def test_a_good_limit_is_taken() -> None:
    assert parser().parse_args(["retained", "--tenant", "acme", "--limit", "7"]).limit == 7
