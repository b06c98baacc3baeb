"""The registry: takeover kicks by epoch, tombstones for kicks that beat their CONNECT."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from services.connection.registry import TOMBSTONE_TTL_S, Registry


class FakeConn:
    """Hashable by identity, like a real connection."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.registered = False


def _conn(client_id: str, epoch: int, tenant: str = "t") -> Any:
    ch = SimpleNamespace(tenant=tenant, client_id=client_id, epoch=epoch, disconnect_expiry_s=None)
    return FakeConn(ch)


def test_a_kick_closes_the_connections_up_to_its_epoch() -> None:
    reg = Registry()
    old, new = _conn("c", 1), _conn("c", 3)
    for c in (old, new):
        reg.opened(c)
        reg.accepted(c)
    assert reg.kick(("t", "c"), 2, now=0.0) == [old]
    assert set(reg.kick(("t", "c"), 0, now=0.0)) == {old, new}  # epoch 0: admin kick, all
    assert reg.kick(("other", "c"), 5, now=0.0) == []


def test_a_kick_before_the_connect_answer_supersedes_it_until_it_expires() -> None:
    reg = Registry()
    reg.kick(("t", "c"), 4, now=10.0)
    assert reg.superseded(("t", "c"), 4) and reg.superseded(("t", "c"), 3)
    assert not reg.superseded(("t", "c"), 5)
    reg.expire_tombstones(10.0 + TOMBSTONE_TTL_S + 1)
    assert not reg.superseded(("t", "c"), 4)


def test_closed_connections_leave_the_registry() -> None:
    reg = Registry()
    c = _conn("c", 1)
    reg.opened(c)
    reg.accepted(c)
    reg.closed(c, now=0.0)
    assert len(reg) == 0 and reg.kick(("t", "c"), 0, now=0.0) == []


def test_an_ended_connection_is_remembered_with_its_disconnect_expiry() -> None:
    reg = Registry()
    c = _conn("c", 7)
    c.channel.disconnect_expiry_s = 0
    reg.opened(c)
    reg.accepted(c)
    assert reg.ended(("t", "c"), 7) == (False, None)  # still connected
    reg.closed(c, now=5.0)
    assert reg.ended(("t", "c"), 7) == (True, 0)
    assert reg.ended(("t", "c"), 6) == (False, None)  # another connection
    reg.expire_tombstones(5.0 + TOMBSTONE_TTL_S + 1)
    assert reg.ended(("t", "c"), 7) == (False, None)
