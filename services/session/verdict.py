"""What every authenticator of the chain reads (`Presented`) and answers (`Verdict`), and the
ACL rules an external authenticator (JWT claim, HTTP answer) may grant.

A verdict is ALLOW (with the identity and extra ACL rules), DENY (with the CONNACK reason
code), or IGNORE (not this authenticator's kind of credential, or an unknown user: the next one
in the tenant's chain decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from services.common.acl import Access, AclRule
from services.common.mqtt.errors import MqttError
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import validate_topic_filter


class Decision(Enum):
    ALLOW = "allow"
    DENY = "deny"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class Presented:
    """What a client presented: its CONNECT and its transport."""

    tenant: str  # from the user name (`tenant/name`), else the certificate, else `default`
    name: str  # the user name without its tenant
    username: str  # the user name as sent
    password: bytes | None
    client_id: str
    peer_address: str
    cert_common_name: str = ""
    cert_subject_alt_names: tuple[str, ...] = ()
    tenant_named: bool = False  # the user name (or certificate) said which tenant


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    name: str = ""  # ALLOW: the user (within its tenant) the ACL applies to
    tenant: str = ""  # ALLOW: the tenant the credential names (empty: the presented one)
    acl: tuple[AclRule, ...] = ()  # ALLOW: rules before the tenant's own
    reason_code: int = RC.BAD_USER_NAME_OR_PASSWORD  # DENY
    reason: str = ""
    cacheable: bool = True  # False: a transient answer (timeout, busy)


IGNORE = Verdict(Decision.IGNORE)


def allow(name: str, tenant: str = "", acl: tuple[AclRule, ...] = ()) -> Verdict:
    return Verdict(Decision.ALLOW, name, tenant, acl)


def deny(reason: str, code: int = RC.BAD_USER_NAME_OR_PASSWORD, cacheable: bool = True) -> Verdict:
    return Verdict(Decision.DENY, reason_code=code, reason=reason, cacheable=cacheable)


class Authenticator(Protocol):
    """One link of a tenant's chain."""

    async def authenticate(self, p: Presented) -> Verdict: ...


_PERMISSIONS = {"allow": True, "deny": False}
_ACTIONS = {"publish": Access.PUBLISH, "subscribe": Access.SUBSCRIBE, "all": Access.ALL}
MAX_EXTERNAL_RULES = 256


def rules_from_external(data: Any) -> tuple[AclRule, ...]:
    """ACL rules as a JWT claim or an HTTP auth answer gives them:
    `[{"permission": "allow", "action": "publish", "topic": "devices/%c/#"}, ...]`
    (action: publish, subscribe or all). ValueError names a bad rule."""
    if not isinstance(data, list):
        raise ValueError("acl must be a list of rules")
    if len(data) > MAX_EXTERNAL_RULES:
        raise ValueError(f"acl has more than {MAX_EXTERNAL_RULES} rules")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"acl[{i}] must be an object")
        allow_ = _PERMISSIONS.get(str(item.get("permission", "")).lower())
        access = _ACTIONS.get(str(item.get("action", "")).lower())
        topic = item.get("topic")
        if allow_ is None or access is None or not isinstance(topic, str) or not topic:
            raise ValueError(f"acl[{i}] needs permission allow|deny, action, topic")
        try:
            validate_topic_filter(topic.replace("%u", "u").replace("%c", "c"))
        except MqttError as exc:
            raise ValueError(f"acl[{i}].topic: {exc}") from None
        out.append(AclRule(allow_, access, topic))
    return tuple(out)
