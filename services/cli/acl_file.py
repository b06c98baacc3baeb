"""The ACL file of `starling acl-set` (and the rules `starling acl-get` prints): a JSON list
of rules as docs/clients.md shows them, e.g.
`{"permission": "PERMISSION_ALLOW", "action": "ACL_ACTION_PUBLISH", "topic_filter": "a/%c/#"}`
with optional `username` and `client_id`."""

from __future__ import annotations

from typing import Any

from services.common.acl import Access, AclRule
from services.common.rpc.errors import InvalidArgumentError

_PERMISSIONS = {"PERMISSION_ALLOW": True, "PERMISSION_DENY": False}
_ACTIONS = {f"ACL_ACTION_{a.name}": a for a in Access}
_KEYS = {"permission", "action", "topic_filter", "username", "client_id"}


def rule_to_json(r: AclRule) -> dict[str, str]:
    out = {
        "permission": "PERMISSION_ALLOW" if r.allow else "PERMISSION_DENY",
        "action": f"ACL_ACTION_{r.access.name}",
        "topic_filter": r.topic_filter,
    }
    if r.username:
        out["username"] = r.username
    if r.client_id:
        out["client_id"] = r.client_id
    return out


def rules_from_json(data: Any) -> list[AclRule]:
    """Raises `InvalidArgumentError` naming the bad rule; the session service checks the
    topic filters."""
    if not isinstance(data, list):
        raise InvalidArgumentError("the ACL file must hold a JSON list of rules")
    return [_rule(item, i) for i, item in enumerate(data)]


def _rule(item: Any, i: int) -> AclRule:
    if not isinstance(item, dict):
        raise InvalidArgumentError(f"rules[{i}] must be an object")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise InvalidArgumentError(f"rules[{i}]: unknown field {unknown[0]!r}")
    allow = _PERMISSIONS.get(item.get("permission", ""))
    if allow is None:
        raise InvalidArgumentError(f"rules[{i}].permission must be one of {sorted(_PERMISSIONS)}")
    access = _ACTIONS.get(item.get("action", ""))
    if access is None:
        raise InvalidArgumentError(f"rules[{i}].action must be one of {sorted(_ACTIONS)}")
    fields = {k: item.get(k, "") for k in ("topic_filter", "username", "client_id")}
    for name, value in fields.items():
        if not isinstance(value, str):
            raise InvalidArgumentError(f"rules[{i}].{name} must be a string")
    return AclRule(allow, access, fields["topic_filter"], fields["username"], fields["client_id"])
