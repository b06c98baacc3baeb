"""What a rule sees of one message or client event: `MessageView`, built once per message and
shared by every rule that matches it, so the payload is decoded as JSON at most once."""

from __future__ import annotations

from typing import Any

from services.rules.sql import jsoncodec

_UNDECODED = object()


class MessageView:
    """The fields a rule can reach. `payload` stays bytes until a rule asks for it as text or
    JSON; each form is computed once and cached."""

    __slots__ = (
        "_json",
        "_props",
        "_segments",
        "_text",
        "clientid",
        "event",
        "message_id",
        "node",
        "payload",
        "published_at_ms",
        "qos",
        "retain",
        "tenant",
        "topic",
        "user_properties",
        "username",
    )

    def __init__(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        retain: bool = False,
        clientid: str = "",
        username: str = "",
        node: str = "",
        published_at_ms: int = 0,
        message_id: str = "",
        user_properties: tuple[tuple[str, str], ...] = (),
        event: str = "",
    ) -> None:
        self.tenant = tenant
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.clientid = clientid
        self.username = username
        self.node = node
        self.published_at_ms = published_at_ms
        self.message_id = message_id
        self.user_properties = user_properties
        self.event = event
        self._json: Any = _UNDECODED
        self._text: str | None = None
        self._segments: list[str] | None = None
        self._props: dict[str, str] | None = None

    def json(self) -> Any:
        """The payload as JSON, or None when it is not JSON (a rule then sees NULL)."""
        if self._json is _UNDECODED:
            try:
                self._json = jsoncodec.loads(self.payload)
            except (ValueError, RecursionError):
                # RecursionError: a payload nested deeper than the decoder's stack.
                self._json = None
        return self._json

    def text(self) -> str:
        """The payload as text (UTF-8; undecodable bytes become U+FFFD)."""
        if self._text is None:
            self._text = self.payload.decode("utf-8", "replace")
        return self._text

    def segments(self) -> list[str]:
        if self._segments is None:
            self._segments = self.topic.split("/")
        return self._segments

    def props(self) -> dict[str, str]:
        """User properties by name; a repeated name keeps its last value."""
        if self._props is None:
            self._props = dict(self.user_properties)
        return self._props
