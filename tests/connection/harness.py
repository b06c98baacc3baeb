"""A channel driven like the node drives it, with a decoder on the client's side of the wire."""

from __future__ import annotations

from services.common.acl import AclRule
from services.common.connect import ConnectOutcome
from services.common.mqtt import EMPTY, Connect, Decoder, Packet, Properties, encode
from services.connection.channel import Action, Authenticate, Channel, ChannelConfig, State

ASSIGNED_ID = "auto-test"


# Reason Strings off unless a test turns them on: most tests compare replies byte for byte.
PLAIN = ChannelConfig(reason_strings=False)


def new_channel(config: ChannelConfig | None = None, now: float = 0.0) -> Channel:
    return Channel(config or PLAIN, "peer", now, lambda: ASSIGNED_ID)


def connected(
    level: int = 5,
    *,
    acl: tuple[AclRule, ...] = (),
    config: ChannelConfig | None = None,
    connect_props: Properties | None = None,
    keepalive_s: int = 10,
) -> tuple[Channel, Decoder]:
    """A channel past CONNACK, its `out` cleared, and the client's decoder."""
    ch = new_channel(config)
    connect = Connect("c", level, keepalive_s=keepalive_s, properties=connect_props or EMPTY)
    actions = ch.receive(encode(connect, level), 0.0)
    assert [type(a) for a in actions] == [Authenticate]
    assert ch.authenticated(ConnectOutcome(tenant="t", epoch=1, acl=acl), 0.0) == []
    assert ch.state is State.CONNECTED
    ch.out.clear()
    return ch, Decoder(level)


def written(ch: Channel, dec: Decoder) -> list[Packet]:
    """The packets the channel wrote since the last call (as the client decodes them)."""
    packets = dec.feed(bytes(ch.out))
    ch.out.clear()
    return packets


def take(ch: Channel) -> bytes:
    data = bytes(ch.out)
    ch.out.clear()
    return data


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]
