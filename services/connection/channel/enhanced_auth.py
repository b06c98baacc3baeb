"""MQTT 5 enhanced authentication of one connection (MQTT 5 section 4.12): the AUTH packets
of the exchange at CONNECT and of re-authentication (AUTH 0x19) later.

The session service runs the method (SCRAM); this module only keeps the exchange in order:
the method named by CONNECT, the opaque state between steps, whether the client owes us an
AUTH, and the AUTH packets we write. Any AUTH out of turn, or naming another method, is a
protocol error [MQTT-4.12.0-5].
"""

from __future__ import annotations

from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import ProtocolViolationError
from services.common.mqtt.packets import Auth
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason import ReasonCode as RC


class AuthExchange:
    __slots__ = ("asked_at", "awaiting", "identity", "method", "reauthenticating", "state")

    def __init__(self) -> None:
        self.method: str | None = None  # from CONNECT; None: no enhanced authentication
        self.state = b""  # the session service's, handed back with the client's next AUTH
        self.awaiting = False  # we sent AUTH 0x18 and wait for the client's
        self.asked_at = 0.0
        self.reauthenticating = False
        self.identity = ""  # `tenant/name` the connection authenticated as

    def challenge(self, data: bytes | None, state: bytes, now: float) -> bytes:
        """AUTH 0x18 with the method's data for the client; its answer is owed."""
        self.state = state
        self.awaiting = True
        self.asked_at = now
        return self._auth(RC.CONTINUE_AUTHENTICATION, data)

    def answer(self, p: Auth) -> bytes:
        """The client's AUTH 0x18 answering our challenge: its data for the next step."""
        if not self.awaiting or p.reason_code != RC.CONTINUE_AUTHENTICATION:
            raise ProtocolViolationError("AUTH out of turn")
        self._check_method(p)
        self.awaiting = False
        return p.properties.authentication_data or b""

    def begin_reauthentication(self, p: Auth) -> bytes:
        """The client's AUTH 0x19: the first step's data."""
        if self.method is None:
            raise ProtocolViolationError("AUTH without an authentication method")
        if p.reason_code != RC.RE_AUTHENTICATE or self.reauthenticating:
            raise ProtocolViolationError("AUTH out of turn")
        self._check_method(p)  # [MQTT-4.12.1-1] the method of CONNECT
        self.reauthenticating = True
        self.state = b""
        return p.properties.authentication_data or b""

    def succeeded(self, data: bytes | None) -> bytes:
        """Re-authentication done: AUTH 0x00 with the method's final data."""
        self.reauthenticating = False
        self.state = b""
        return self._auth(RC.SUCCESS, data)

    def overdue(self, now: float, timeout_s: float) -> bool:
        """The client has owed its AUTH for longer than `timeout_s`."""
        return self.awaiting and now - self.asked_at > timeout_s

    def _check_method(self, p: Auth) -> None:
        if p.properties.authentication_method != self.method:
            raise ProtocolViolationError("AUTH with another authentication method")

    def _auth(self, code: int, data: bytes | None) -> bytes:
        props = Properties(authentication_method=self.method, authentication_data=data)
        return encode(Auth(code, props), 5)
