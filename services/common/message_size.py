"""The one definition of a message's size, "bytes in": what the usage tables and the tenant
report bill and what the `bytes_in_per_s` quota limits, so a bill and a limit always agree.

A message's size is its payload's bytes plus its topic name's UTF-8 bytes. Protocol overhead
(fixed header, length fields, packet id, MQTT 5 properties) is not counted: it depends on the
client's protocol version and encoding choices, not on what the tenant sends, and the exact
figure would take the decoder's packet lengths down the hot path. docs/quota.md and
docs/metrics.md state the same definition.
"""

from __future__ import annotations


def message_bytes(topic: str, payload: bytes) -> int:
    """Payload bytes plus the topic's UTF-8 bytes (`str.isascii` is a flag check, so the
    encode runs only for the rare non-ASCII topic)."""
    if topic.isascii():
        return len(payload) + len(topic)
    return len(payload) + len(topic.encode())
