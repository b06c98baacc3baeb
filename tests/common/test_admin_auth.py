"""Which tenant an admin request acts on, and the cache of tenant-token answers."""

from __future__ import annotations

from services.common.admin_tokens import new_token, token_id_of
from services.common.rpc.admin_auth import CachedTokenResolver, TenantGrant, tenant_of
from starling.metrics.v1 import metrics_pb2
from starling.router.v1 import router_pb2
from starling.rules.v1 import rules_pb2


def test_tenant_of_a_request() -> None:
    assert tenant_of(router_pb2.ListRetainedRequest(tenant="acme")) == "acme"
    assert tenant_of(router_pb2.ListRetainedRequest()) == ""  # names the empty tenant
    # Nested: CreateRuleRequest.rule.tenant.
    assert tenant_of(rules_pb2.CreateRuleRequest(rule=rules_pb2.Rule(tenant="acme"))) == "acme"
    assert tenant_of(metrics_pb2.GetClusterStatsRequest()) is None  # spans every tenant


def test_token_shape() -> None:
    token_id, token = new_token()
    assert token_id_of(token) == token_id
    for bad in ("", "stk_", token + "0", token.replace("stk_", "xtk_"), token.upper()):
        assert token_id_of(bad) is None


async def test_answers_are_cached_and_the_cache_is_bounded() -> None:
    asked: list[str] = []

    async def lookup(token: str) -> TenantGrant | None:
        asked.append(token)
        return TenantGrant("acme", "id") if token == "good" else None

    cache = CachedTokenResolver(lookup, ttl_s=60, max_entries=3)
    assert await cache.resolve("good") == TenantGrant("acme", "id")
    assert await cache.resolve("good") == TenantGrant("acme", "id")
    assert await cache.resolve("bad") is None
    assert await cache.resolve("bad") is None
    assert asked == ["good", "bad"]
    for guess in ("g1", "g2", "g3"):  # guesses push the oldest answers out
        await cache.resolve(guess)
    await cache.resolve("good")
    assert asked.count("good") == 2

    uncached = CachedTokenResolver(lookup, ttl_s=0)
    await uncached.resolve("good")
    await uncached.resolve("good")
    assert asked.count("good") == 4


def test_a_tenant_name_may_not_end_in_a_newline() -> None:
    import pytest

    from services.common.tenant_name import check_tenant

    check_tenant("acme-1_b")
    for bad in ("acme\n", "acme ", "", "a" * 65, "a/b"):
        with pytest.raises(ValueError, match="invalid tenant name"):
            check_tenant(bad)
