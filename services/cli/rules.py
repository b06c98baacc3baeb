"""`starling rules ...`: rules of a tenant (create, list, show with metrics, enable, disable,
delete, test against a sample message) and their dead letters (`starling rules dlq list|
replay|purge`), over the rules service's admin API (services/rules/admin_client.py); and
`starling autosub list|add|delete`: the tenant's auto-subscriptions (docs/rules.md).

Replies print as JSON; a payload prints as text when it is UTF-8, else as base64 under
`payload_base64`. Actions are given as JSON objects, `{"kind": "republish", "params":
{"topic": "out/${topic}"}}`, one per `--action` (repeatable) or a list in `--actions-file`.

The commands' arguments are services/cli/rules_args.py's; this module, which loads gRPC and
the rules API's messages, is imported only when one of them runs."""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from services.rules.admin_client import RulesAdminClient
from starling.rules.v1 import rules_pb2 as pb


def _dict(msg: Message) -> dict[str, Any]:
    """Every field of `msg` (defaults too) under its proto name; 64-bit integers stay numbers
    (protobuf's JSON mapping would make them strings), bytes are base64."""
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            out[fd.name] = {k: _value(v) for k, v in value.items()}
        elif fd.is_repeated:
            out[fd.name] = [_value(v) for v in value]
        elif fd.message_type is not None and not msg.HasField(fd.name):
            continue
        else:
            out[fd.name] = _value(value)
    return out


def _value(value: Any) -> Any:
    if isinstance(value, Message):
        return _dict(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _payload(out: dict[str, Any], raw: bytes, key: str = "payload") -> dict[str, Any]:
    """`raw` as text when it is UTF-8, else base64 (under `<key>_base64`)."""
    out.pop(key, None)
    try:
        out[key] = raw.decode()
    except UnicodeDecodeError:
        out[f"{key}_base64"] = base64.b64encode(raw).decode()
    return out


def parse_actions(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """The `--action` JSON objects and the `--actions-file` list, in that order."""
    items: list[Any] = [json.loads(a) for a in args.action or []]
    if args.actions_file:
        loaded = json.loads(Path(args.actions_file).read_text())
        items.extend(loaded if isinstance(loaded, list) else [loaded])
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise ValueError(f'action {i}: an object {{"kind": ..., "params": {{...}}}}')
        params = item.get("params") or {}
        if not isinstance(params, dict):
            raise ValueError(f"action {i}: params must be an object")
        # Params are strings on the wire; numbers and booleans are accepted as their text.
        out.append((item["kind"], {str(k): _text(v) for k, v in params.items()}))
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def _sql(args: argparse.Namespace) -> str:
    if getattr(args, "sql_file", None):
        return Path(args.sql_file).read_text()
    return str(args.sql or "")


def _sample(args: argparse.Namespace) -> pb.SampleMessage:
    props = {}
    for item in args.user_property or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--user-property {item!r}: name=value")
        props[key] = value
    payload = args.payload.encode() if args.payload is not None else b""
    if args.payload_file:
        payload = Path(args.payload_file).read_bytes()
    return pb.SampleMessage(
        topic=args.topic,
        payload=payload,
        qos=args.qos,
        retain=args.retain,
        client_id=args.client_id,
        username=args.username,
        user_properties=props,
    )


async def rules_call(c: RulesAdminClient, args: argparse.Namespace) -> object:
    cmd, tenant = args.rules_command, args.tenant
    if cmd == "create":
        rule = await c.create(
            tenant,
            args.rule_id,
            _sql(args),
            parse_actions(args),
            enabled=not args.disabled,
            description=args.description,
        )
        return _dict(rule)
    if cmd == "list":
        return {"rules": [_dict(r) for r in await c.list(tenant)]}
    if cmd == "show":
        return _dict(await c.get(tenant, args.rule_id))
    if cmd in ("enable", "disable"):
        return _dict(await c.set_enabled(tenant, args.rule_id, cmd == "enable"))
    if cmd == "delete":
        return {"deleted": await c.delete(tenant, args.rule_id)}
    if cmd == "test":
        resp = await c.test(tenant, _sample(args), rule_id=args.rule_id or "", sql=_sql(args))
        return _payload(_dict(resp), resp.output, "output")
    if cmd == "dlq":
        return await _dlq(c, args)
    raise SystemExit(f"unknown rules command {cmd}")


async def _dlq(c: RulesAdminClient, args: argparse.Namespace) -> object:
    cmd, tenant, rid = args.dlq_command, args.tenant, args.rule_id
    if cmd == "list":
        resp = await c.dead_letters(tenant, rid, args.after, args.limit)
        return {
            "count": resp.count,
            "bytes": resp.bytes,
            "letters": [_payload(_dict(d), d.payload) for d in resp.letters],
        }
    if cmd == "replay":
        return _dict(await c.replay(tenant, rid, args.ids or ()))
    return {"purged": await c.purge(tenant, rid)}


async def autosub_call(c: RulesAdminClient, args: argparse.Namespace) -> object:
    cmd, tenant = args.autosub_command, args.tenant
    if cmd == "list":
        return {"subscriptions": [_dict(s) for s in await c.autosubs(tenant)]}
    if cmd == "add":
        return {
            "subscriptions": [_dict(s) for s in await c.add_autosub(tenant, args.filter, args.qos)]
        }
    return {"deleted": await c.delete_autosub(tenant, args.filter)}


async def run_rules(args: argparse.Namespace, address: str, token: str) -> object:
    client = RulesAdminClient(address, token)
    try:
        if args.command == "autosub":
            return await autosub_call(client, args)
        return await rules_call(client, args)
    finally:
        await client.close()
