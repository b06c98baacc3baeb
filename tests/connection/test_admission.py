"""Connections per peer address on a node: the address behind each peer form, counting from
accept to close, and the cap (the e2e refusal is in tests/security/test_tenant_limits.py)."""

from __future__ import annotations

from services.connection.admission import PerAddress, peer_address


def test_peer_address_of_each_transport() -> None:
    assert peer_address("10.0.0.7:50123") == "10.0.0.7"
    assert peer_address("::1:50123") == "::1"
    assert peer_address("ws:10.0.0.7") == "10.0.0.7"
    assert peer_address("?") == "?"


def test_cap_counts_open_connections_of_one_address() -> None:
    per = PerAddress(2)
    per.opened("10.0.0.7:1")
    per.opened("10.0.0.7:2")
    assert not per.over("10.0.0.7:2")
    per.opened("ws:10.0.0.7")  # the same address over WebSocket counts too
    assert per.over("ws:10.0.0.7") and per.over("10.0.0.7:1")
    per.opened("10.0.0.8:1")
    assert not per.over("10.0.0.8:1")  # another address is not affected
    per.closed("10.0.0.7:1")
    assert not per.over("10.0.0.7:2") and per.count("10.0.0.7:9") == 2
    per.closed("10.0.0.7:2")
    per.closed("ws:10.0.0.7")
    assert per.count("10.0.0.7:1") == 0


def test_zero_means_no_cap() -> None:
    per = PerAddress(0)
    for i in range(5000):
        per.opened(f"10.0.0.7:{i}")
    assert not per.over("10.0.0.7:1")
