"""The CONNECT check against the ban list and flapping detection, run after the client is
authenticated (so bans by user and tenant-scoped client id apply) and before its registry
claim (so a banned client never displaces the connection of its client id).

A flapping client gets a ban through the quota service (cluster-wide, durable, announced to
every node and session service) and this CONNECT is refused at once; if the quota service
cannot be reached the ban is kept here only, until it expires.
"""

from __future__ import annotations

import logging

from services.common import clock
from services.common.bans import Ban, BanKind, BanList
from services.quota.client import QuotaClient
from services.session.flapping import Flap, FlapDetector

log = logging.getLogger("starling.session.gatekeeper")


class Gatekeeper:
    def __init__(
        self,
        bans: BanList,
        quota: QuotaClient | None,
        flapping: FlapDetector | None,
        flapping_ban_s: int,
    ) -> None:
        self._bans = bans  # kept current by services/common/ban_watch.py
        self._quota = quota
        self._flapping = flapping
        self._ban_s = flapping_ban_s
        self._local = BanList()  # automatic bans the quota service did not take
        self._local_bans: list[Ban] = []

    async def check(self, tenant: str, client_id: str, user: str, peer: str) -> str:
        """ "" when the client may go on; otherwise why it is refused (banned)."""
        now_ms = clock.now_ms()
        ban = self._bans.match(tenant, client_id, user, peer, now_ms)
        if ban is None and self._local_bans:
            ban = self._local.match(tenant, client_id, user, peer, now_ms)
        if ban is not None:
            return ban.reason or "banned"
        if self._flapping is None:
            return ""
        flap = await self._flapping.connected(tenant, client_id, peer, now_ms)
        if flap is None:
            return ""
        limits = self._flapping.limit_text(flap)
        ban = self._ban_of(flap, tenant, now_ms, limits)
        reason = ban.reason
        log.warning(
            "client_flapping",
            extra={
                "tenant": tenant,
                "client_id": client_id,
                "address": flap.address,
                "connects": flap.connects,
                "limits": limits,  # the settings the reason names
                "ban_s": self._ban_s,
                "setting": "flapping_enabled",  # false turns detection off
            },
        )
        try:
            if self._quota is None:
                raise RuntimeError("no quota service")
            await self._quota.add_ban(ban, self._ban_s)
        except Exception as exc:
            log.warning("flapping_ban_kept_locally", extra={"error": type(exc).__name__})
            self._local_bans = [b for b in self._local_bans if b.active(now_ms)] + [ban]
            self._local.replace(self._local_bans)
        return reason

    def _ban_of(self, flap: Flap, tenant: str, now_ms: int, limits: str) -> Ban:
        """The ban of a flapping client (or address), its reason naming the settings
        (`limits`) so that whoever meets the refusal knows what to change."""
        if flap.client_id:
            kind, scope, value = BanKind.CLIENT_ID, tenant, flap.client_id
            what = f"client id {flap.client_id!r} from {flap.address}"
        else:
            kind, scope, value = BanKind.ADDRESS, "", flap.address
            what = f"address {flap.address}"
        reason = (
            f"flapping: {flap.connects} connects of {what} within the window "
            f"({limits}); banned for {self._ban_s} s (flapping_ban_s); "
            "flapping_enabled=false turns this off"
        )
        return Ban(
            kind=kind,
            tenant=scope,
            value=value,
            reason=reason,
            expires_at_ms=now_ms + self._ban_s * 1000,
            created_at_ms=now_ms,
            source="flapping",
        )
