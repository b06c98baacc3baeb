"""The one definition of a message's size (services/common/message_size.py): payload bytes
plus the topic's UTF-8 bytes, what usage bills as bytes in/out and the byte quotas limit
(the mesh test tests/e2e/test_cluster_metrics.py checks the counters against it)."""

from __future__ import annotations

from services.common.message_size import message_bytes


def test_payload_plus_topic_in_utf8_bytes() -> None:
    assert message_bytes("a/b", b"0123456789") == 13
    assert message_bytes("", b"") == 0
    # A non-ASCII topic counts its encoded bytes, not its characters.
    assert message_bytes("température/é", b"x") == len("température/é".encode()) + 1 == 16
