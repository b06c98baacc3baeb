"""A tenant's authenticators tried in order: the first ALLOW or DENY decides, IGNORE passes
on; all IGNORE is IGNORE (then anonymous access decides). An ALLOW naming another tenant
than the client's user name named is refused (0x87)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.mqtt.reason import ReasonCode as RC
from services.session.verdict import IGNORE, Authenticator, Decision, Presented, Verdict, deny


class Chains:
    def __init__(
        self, chains: Mapping[str, Sequence[str]], authenticators: Mapping[str, Authenticator]
    ) -> None:
        self._names = {tenant: list(chain) for tenant, chain in chains.items()}
        self._by_name = authenticators

    def names(self, tenant: str) -> list[str]:
        """The tenant's chain as configured (the `*` one for tenants not listed)."""
        return self._names.get(tenant, self._names.get("*", ["password"]))

    async def authenticate(self, p: Presented) -> Verdict:
        for name in self.names(p.tenant):
            authenticator = self._by_name.get(name)
            if authenticator is None:  # "scram": enhanced authentication, not a chain link
                continue
            verdict = await authenticator.authenticate(p)
            if verdict.decision is Decision.IGNORE:
                continue
            if (
                verdict.decision is Decision.ALLOW
                and verdict.tenant
                and verdict.tenant != p.tenant
                and p.tenant_named
            ):
                return deny(f"credential is for tenant {verdict.tenant!r}", RC.NOT_AUTHORIZED)
            return verdict
        return IGNORE
