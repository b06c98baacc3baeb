"""Topic name and topic filter rules (spec 4.7) with configurable length and depth limits."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.mqtt.errors import TopicFilterInvalidError, TopicNameInvalidError


@dataclass(frozen=True, slots=True)
class TopicLimits:
    max_length_bytes: int = 4096
    max_levels: int = 32


DEFAULT_LIMITS = TopicLimits()
# Beyond what any MQTT string can hold: for filters a channel has checked against its node's
# limits already (which may exceed the defaults), so re-parsing them never refuses one.
NO_LIMITS = TopicLimits(max_length_bytes=65535, max_levels=65536)


def validate_topic_name(topic: str, limits: TopicLimits = DEFAULT_LIMITS) -> None:
    """Raise `TopicNameInvalidError` (0x90) unless `topic` may be published to."""
    if not topic:
        raise TopicNameInvalidError("topic name is empty")  # [MQTT-4.7.3-1]
    if "+" in topic or "#" in topic:
        raise TopicNameInvalidError("topic name contains a wildcard")  # [MQTT-3.3.2-2]
    if len(topic) > limits.max_length_bytes or len(topic.encode()) > limits.max_length_bytes:
        raise TopicNameInvalidError("topic name too long", limit="max_topic_length_bytes")
    if topic.count("/") >= limits.max_levels:
        raise TopicNameInvalidError("topic name has too many levels", limit="max_topic_levels")


def validate_topic_filter(filt: str, limits: TopicLimits = DEFAULT_LIMITS) -> None:
    """Raise `TopicFilterInvalidError` (0x8F) unless `filt` is a valid subscription filter."""
    if not filt:
        raise TopicFilterInvalidError("topic filter is empty")  # [MQTT-4.7.3-1]
    if len(filt) > limits.max_length_bytes or len(filt.encode()) > limits.max_length_bytes:
        raise TopicFilterInvalidError("topic filter too long", limit="max_topic_length_bytes")
    levels = filt.split("/")
    if len(levels) > limits.max_levels:
        raise TopicFilterInvalidError("topic filter has too many levels", limit="max_topic_levels")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            # [MQTT-4.7.1-1] '#' alone in its level and the last level.
            raise TopicFilterInvalidError("'#' must be the last level on its own")
        if "+" in level and level != "+":
            raise TopicFilterInvalidError("'+' must occupy a whole level")  # [MQTT-4.7.1-2]


def is_wildcard(filt: str) -> bool:
    return "+" in filt or "#" in filt


def is_sys_topic(topic: str) -> bool:
    """`$SYS` and below: the server's own topics, which no client may publish to, by a
    PUBLISH or as its will."""
    return topic[:1] == "$" and (topic == "$SYS" or topic.startswith("$SYS/"))


def topic_matches(filt: str, topic: str) -> bool:
    """Naive reference matcher (spec 4.7), used by tests and cold paths."""
    if topic.startswith("$") and filt[:1] in ("+", "#"):
        return False  # [MQTT-4.7.2-1]
    f_levels = filt.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
