"""The parts of the session service built from its settings, for its composition root
(services/session/main.py): the stores and the other services' clients as bundles with one
close each, the login with the authenticators the tenants' chains name and the back-off in
front of them, and the gatekeeper of CONNECTs (bans and flapping)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from services.common.ban_watch import BanWatch
from services.common.redis_client import PoolLimits, redis_client
from services.common.store.eventlog import LoggedSessionStore
from services.common.store.open import open_auth_store, open_session_store, open_token_store
from services.common.store.ports_auth import AdminTokenStore, AuthStore
from services.queue.client import QueueAdminClient, QueueClient
from services.quota.client import QuotaClient, bans_from_announcement
from services.router.client import RouterClient
from services.session.auth import Authenticator
from services.session.authenticators.cert import CertAuthenticator
from services.session.authenticators.chain import Chains
from services.session.authenticators.http_auth import HttpAuthConfig, HttpAuthenticator
from services.session.authenticators.jwt_auth import JwtAuthenticator, JwtConfig
from services.session.authenticators.password import PasswordAuthenticator
from services.session.config import SessionSettings
from services.session.enhanced import EnhancedAuth
from services.session.flapping import FlapDetector
from services.session.gatekeeper import Gatekeeper
from services.session.login import Login
from services.session.throttle import AuthThrottle, Backoff, HashGate
from services.session.verdict import Authenticator as Verdicts


def session_redis(s: SessionSettings) -> Redis:
    """The registry's Redis. A restarted Redis (or a failover) breaks every pooled connection
    at once: a command is retried on a fresh one rather than failing the CONNECT that
    happened to use it. A bounded pool makes a command wait for a connection (redis-py's
    default pool raises MaxConnectionsError past 100 connections in use: a CONNECT storm
    would fail)."""
    return redis_client(
        s,
        PoolLimits(
            max_connections=s.redis_max_connections,
            pool_timeout_s=s.redis_pool_timeout_s,
            retries=2,
        ),
    )


@dataclass(frozen=True, slots=True)
class Stores:
    auth: AuthStore
    session: LoggedSessionStore
    tokens: AdminTokenStore

    @classmethod
    def open(cls, s: SessionSettings) -> Stores:
        return cls(
            auth=open_auth_store(s), session=open_session_store(s), tokens=open_token_store(s)
        )

    async def close(self) -> None:
        await self.auth.close()
        await self.session.close()
        await self.tokens.close()


@dataclass(frozen=True, slots=True)
class Remotes:
    """The clients of the other services, and the ban list kept current from the quota
    service (checked at CONNECT)."""

    router: RouterClient
    queues: QueueClient
    queue_admin: QueueAdminClient
    quota: QuotaClient
    ban_watch: BanWatch

    @classmethod
    def of(cls, s: SessionSettings) -> Remotes:
        return cls(
            router=RouterClient(s.router_addr),
            queues=QueueClient(s.queue_addr),
            queue_admin=QueueAdminClient(s.queue_addr, s.admin_token.get_secret_value()),
            quota=QuotaClient(s.quota_addr, timeout_s=2.0),
            ban_watch=BanWatch(
                client=QuotaClient(s.quota_addr, timeout_s=2.0),
                decode=bans_from_announcement,
                sync_s=s.ban_sync_s,
            ),
        )

    async def close(self) -> None:
        await self.router.close()
        await self.queues.close()
        await self.queue_admin.close()
        await self.ban_watch.stop()
        await self.quota.close()


def build_auth(
    s: SessionSettings,
    store: AuthStore,
    redis: Redis,
    gate: HashGate,
    *,
    announce: Callable[[bytes], Awaitable[None]],
) -> Authenticator:
    """Users and ACLs, cached in Redis and in this process; `announce` tells the other
    instances of a change."""
    return Authenticator(
        store=store,
        redis=redis,
        cache_ttl_s=s.auth_cache_ttl_s,
        anonymous=s.anonymous_tenants,
        gate=gate,
        local_ttl_s=s.auth_local_cache_ttl_s,
        local_entries=s.auth_local_cache_entries,
        announce=announce,
    )


def http_authenticator(s: SessionSettings) -> HttpAuthenticator | None:
    """The HTTP authenticator, if a tenant's chain names it (None: none does)."""
    if "http" not in _used(s):
        return None
    return HttpAuthenticator(
        HttpAuthConfig(
            url=s.http_auth_url,
            timeout_s=s.http_auth_timeout_s,
            on_timeout=s.http_auth_on_timeout,
            cache_ttl_s=s.http_auth_cache_ttl_s,
            cache_size=s.http_auth_cache_size,
            max_concurrent=s.http_auth_max_concurrent,
        )
    )


def build_login(s: SessionSettings, auth: Authenticator, http: HttpAuthenticator | None) -> Login:
    """The authenticators the tenants' chains name, and the back-off in front of them."""
    return Login(
        auth,
        Chains(s.auth_chain, _authenticators(s, auth, http)),
        EnhancedAuth(auth),
        _throttle(s),
        s.cert_identity,
    )


def _used(s: SessionSettings) -> set[str]:
    return {name for chain in s.auth_chain.values() for name in chain}


def _authenticators(
    s: SessionSettings, auth: Authenticator, http: HttpAuthenticator | None
) -> dict[str, Verdicts]:
    out: dict[str, Verdicts] = {
        "password": PasswordAuthenticator(auth),
        "cert": CertAuthenticator(s.cert_identity),
    }
    if "jwt" in _used(s):
        out["jwt"] = JwtAuthenticator(
            JwtConfig(
                algorithms=tuple(s.jwt_algorithms),
                secret=s.jwt_secret.get_secret_value(),
                public_key_file=s.jwt_public_key_file,
                jwks_url=s.jwt_jwks_url,
                jwks_cache_s=s.jwt_jwks_cache_s,
                audience=s.jwt_audience,
                issuer=s.jwt_issuer,
                tenant_claim=s.jwt_tenant_claim,
                username_claim=s.jwt_username_claim,
                acl_claim=s.jwt_acl_claim,
            )
        )
    if http is not None:
        out["http"] = http
    return out


def _throttle(s: SessionSettings) -> AuthThrottle:
    def backoff(threshold: int) -> Backoff:
        return Backoff(
            threshold=threshold,
            base_s=s.auth_backoff_base_s,
            max_s=s.auth_backoff_max_s,
            window_s=s.auth_failure_window_s,
            max_keys=s.auth_backoff_max_tracked,
        )

    return AuthThrottle(
        backoff(s.auth_failures_before_backoff_user), backoff(s.auth_failures_before_backoff_ip)
    )


def build_gatekeeper(s: SessionSettings, redis: Redis, remotes: Remotes) -> Gatekeeper:
    """The ban list (a copy, kept current) and flapping detection, checked at CONNECT."""
    flapping = None
    if s.flapping_enabled:
        flapping = FlapDetector(
            redis,
            s.flapping_max_connects,
            s.flapping_window_s,
            s.flapping_max_connects_per_address,
            s.node_id,
        )
    return Gatekeeper(remotes.ban_watch.bans, remotes.quota, flapping, s.flapping_ban_s)
