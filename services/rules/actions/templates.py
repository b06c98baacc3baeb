"""`${name}` templates of action params (topics, subjects, stream keys, routing keys), and the
escaping that keeps a value from changing the shape of what it lands in (a column cannot add
an MQTT wildcard or level, a NATS token, ...).

Names: a column of the rule's SELECT (a dotted name reaches into a JSON object column), else
one of `topic`, `clientid`, `tenant`, `rule_id`, `message_id`, `qos`, `timestamp` (the
publish time in ms). A name that resolves to nothing fails the output permanently (it goes to
the dead letters with that error) rather than rendering a silently wrong destination.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from services.common.topics.autosub import escape_level_value
from services.rules.actions.base import Output, PermanentActionError

_VAR = re.compile(r"\$\{([^{}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
BUILTINS = ("topic", "clientid", "tenant", "rule_id", "message_id", "qos", "timestamp")
_MISSING = object()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), default=str)


def mqtt_value(value: str) -> str:
    """A value inside an MQTT topic: wildcards, level separators, `$` and NUL percent-escaped
    (`%` too, so the escaping is unambiguous); the same escaping as auto-subscriptions' `%c`."""
    return escape_level_value(value)


def token_value(value: str) -> str:
    """A value that must stay one token of a dot-separated name (NATS subject, AMQP routing
    key, Kafka topic): separators, wildcards and whitespace become `_`."""
    return re.sub(r"[.*>#\s\x00]", "_", value) or "_"


def topic_as_tokens(topic: str) -> str:
    """An MQTT topic as a dot-separated name: each level one token (empty levels `_`)."""
    return ".".join(token_value(level) for level in topic.split("/"))


class Template:
    """A compiled template. `escape` applies to values; `topic` renders `${topic}` (by default
    as-is: a published topic has no wildcards)."""

    def __init__(
        self,
        text: str,
        param: str,
        escape: Callable[[str], str] = mqtt_value,
        topic: Callable[[str], str] = lambda t: t,
    ) -> None:
        self.text = text
        self.param = param
        self._escape = escape
        self._topic = topic
        self._parts: list[str] = []
        self._names: list[str] = []
        pos = 0
        for m in _VAR.finditer(text):
            name = m.group(1).strip()
            if not _NAME.match(name):
                raise ValueError(f"{param}: bad template variable ${{{m.group(1)}}}")
            self._parts.append(text[pos : m.start()])
            self._names.append(name)
            pos = m.end()
        self._parts.append(text[pos:])
        if "${" in "".join(self._parts):
            raise ValueError(f"{param}: unclosed ${{ in template {text!r}")

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def render(self, o: Output) -> str:
        if not self._names:
            return self.text
        out = [self._parts[0]]
        for name, tail in zip(self._names, self._parts[1:], strict=True):
            if name == "topic" and "topic" not in o.columns:
                out.append(self._topic(o.topic))
            else:
                out.append(self._escape(_text(self._lookup(o, name))))
            out.append(tail)
        return "".join(out)

    def _lookup(self, o: Output, name: str) -> Any:
        value: Any = o.columns.get(name, _MISSING)
        if value is _MISSING and "." in name:
            value = o.columns
            for key in name.split("."):
                if isinstance(value, dict) and key in value:
                    value = value[key]
                else:
                    value = _MISSING
                    break
        if value is not _MISSING:
            return value
        builtin = {
            "topic": o.topic,
            "clientid": o.clientid,
            "tenant": o.tenant,
            "rule_id": o.rule_id,
            "message_id": o.message_id,
            "qos": o.qos,
            "timestamp": o.published_at_ms,
        }
        if name in builtin:
            return builtin[name]
        raise PermanentActionError(f"{self.param}: ${{{name}}} is neither a column nor built in")
