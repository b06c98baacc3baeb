"""The user name and password against the user's stored hash (services/session/auth.py)."""

from __future__ import annotations

from services.common.mqtt.reason import ReasonCode as RC
from services.session.auth import Authenticator as Users
from services.session.throttle import GateFullError
from services.session.verdict import IGNORE, Presented, Verdict, allow, deny


class PasswordAuthenticator:
    def __init__(self, users: Users) -> None:
        self._users = users

    async def authenticate(self, p: Presented) -> Verdict:
        try:
            ok = await self._users.check(p.tenant, p.name, p.password)
        except GateFullError:
            return deny("too many logins at once", RC.SERVER_BUSY, cacheable=False)
        if ok is None:
            return IGNORE  # unknown user: the next authenticator (or anonymous access) decides
        if not ok:
            return deny("bad user name or password")
        return allow(p.name)
