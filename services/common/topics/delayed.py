"""`$delayed/{seconds}/{topic}`: the delayed-publish topic form, parsed in one place.

The router schedules such a message; ACL checks and the connection node look through the
prefix to the topic it will be published on (its effective topic).
"""

from __future__ import annotations

from dataclasses import dataclass

DELAYED_PREFIX = "$delayed/"
MAX_DELAY_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class DelayedTopic:
    seconds: int
    topic: str


def parse_delayed(topic: str) -> DelayedTopic | None:
    """`$delayed/10/a/b` -> (10, "a/b"); None when it is not a valid delayed topic."""
    if not topic.startswith(DELAYED_PREFIX):
        return None
    seconds, _, inner = topic[len(DELAYED_PREFIX) :].partition("/")
    if not seconds.isdigit() or not inner or "+" in inner or "#" in inner:
        return None
    return DelayedTopic(min(int(seconds), MAX_DELAY_S), inner)


def effective_topic(topic: str) -> str:
    """The topic a message is finally published on: `$delayed/10/a/b` -> `a/b`."""
    if topic.startswith(DELAYED_PREFIX):
        delayed = parse_delayed(topic)
        if delayed is not None:
            return delayed.topic
    return topic
