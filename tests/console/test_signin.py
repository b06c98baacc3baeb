"""The console's sign-in and scoping without a browser: attempts limited per address
(counted in a real Redis), sessions that end, the one tenant scope, and paging."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from services.common.acl import Access
from services.console.acl_text import AclTextError, format_rules, parse_rules
from services.console.pages_policy import parse_limits
from services.console.signin import Principal, Sessions, now_ms
from services.console.web import scope
from services.session.token_client import TokenClient


def _sessions(redis: Redis, attempts: int = 3) -> Sessions:
    return Sessions(
        redis=redis,
        tokens=TokenClient("127.0.0.1:1"),  # never reached: the operator token is local
        operator_token="op-token",
        ttl_s=600,
        attempts_per_minute=attempts,
    )


async def test_sign_in_attempts_are_limited_per_address(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    sessions = _sessions(redis)
    address = f"192.0.2.{uuid.uuid4().int % 250}-{uuid.uuid4().hex[:6]}"
    allowed = [await sessions.allow_attempt(address) for _ in range(5)]
    assert allowed == [True, True, True, False, False]
    assert await sessions.allow_attempt(f"other-{uuid.uuid4().hex}")  # not held back
    await redis.aclose()


async def test_a_session_is_found_by_its_id_only_and_ends_at_sign_out(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    sessions = _sessions(redis)
    operator = await sessions.principal_of("op-token")
    assert operator is not None and operator.operator and operator.expires_at_ms > now_ms()
    sid = await sessions.open(operator)
    assert await sessions.find(sid) == operator
    assert await sessions.find(sid + "x") is None
    await sessions.close(sid)
    assert await sessions.find(sid) is None
    await redis.aclose()


def test_a_tenant_token_is_held_to_its_tenant() -> None:
    tenant = Principal("t", "acme", "tenant acme", "c", 0)
    operator = Principal("o", "", "operator", "c", 0)
    for asked in ("other", "", " acme ", "acme/../other"):
        assert scope(tenant, asked) == "acme"
    assert scope(operator, " other ") == "other" and scope(operator, "") == ""


def test_acl_text_round_trips_and_names_a_bad_line() -> None:
    text = "deny publish secret/#\nallow subscribe devices/%c/# client=c1\nallow all # user=u"
    rules = parse_rules("# comment\n" + text + "\n\n")
    assert [(r.allow, r.access, r.topic_filter) for r in rules] == [
        (False, Access.PUBLISH, "secret/#"),
        (True, Access.SUBSCRIBE, "devices/%c/#"),
        (True, Access.ALL, "#"),
    ]
    assert rules[1].client_id == "c1" and rules[2].username == "u"
    assert format_rules(rules) == text
    for bad, named in (("allow sometimes x", "line 1"), ("allow all x\ndeny all", "line 2")):
        with pytest.raises(AclTextError, match=named):
            parse_rules(bad)
    with pytest.raises(AclTextError, match="colour=red"):
        parse_rules("allow all x colour=red")


def test_limits_are_whole_numbers() -> None:
    limits = parse_limits({"max_connections": "10", "max_sessions": ""})
    assert limits.max_connections == 10 and limits.max_sessions == 0
    with pytest.raises(ValueError, match="max_connections"):
        parse_limits({"max_connections": "-1"})
