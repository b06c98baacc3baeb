"""The client address behind trusted HTTP proxies (services/common/forwarded.py)."""

from __future__ import annotations

import pytest

from services.common.forwarded import (
    TrustedProxies,
    client_address,
    parse_ip,
    split_x_forwarded_for,
)

LB = TrustedProxies.parse(["10.0.0.0/8", "2001:db8:ffff::/48"])


@pytest.mark.parametrize(
    ("text", "ip"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("192.0.2.7:4711", "192.0.2.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:4711", "2001:db8::1"),
        ('"[2001:db8::1]"', "2001:db8::1"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("unknown", None),
        ("_hidden", None),
        ("fe80::1%eth0", None),
        ("", None),
    ],
)
def test_parse_ip(text: str, ip: str | None) -> None:
    parsed = parse_ip(text)
    assert (str(parsed) if parsed else None) == ip


def test_headers_of_an_untrusted_peer_are_ignored() -> None:
    assert client_address("198.51.100.4", LB, ["203.0.113.9"], ["203.0.113.9"]) == "198.51.100.4"
    assert client_address("198.51.100.4", TrustedProxies(), [], ["1.2.3.4"]) == "198.51.100.4"


def test_x_forwarded_for_right_most_untrusted_entry() -> None:
    xff = split_x_forwarded_for(["6.6.6.6, 203.0.113.9", "10.1.1.1"])
    assert xff == ["6.6.6.6", "203.0.113.9", "10.1.1.1"]
    # 6.6.6.6 is whatever the client wrote; 203.0.113.9 is what the first trusted proxy saw.
    assert client_address("10.0.0.2", LB, [], xff) == "203.0.113.9"


def test_forwarded_wins_over_x_forwarded_for() -> None:
    got = client_address("10.0.0.2", LB, ["[2001:db8::9]:4711"], ["203.0.113.9"])
    assert got == "2001:db8::9"
    got = client_address("10.0.0.2", LB, ["6.6.6.6", "203.0.113.5:1", "10.0.0.3"], [])
    assert got == "203.0.113.5"


def test_an_entry_that_is_no_address_stops_at_the_nearest_known_hop() -> None:
    assert client_address("10.0.0.2", LB, ["unknown"], []) == "10.0.0.2"
    assert client_address("10.0.0.2", LB, [], ["garbage", "10.0.0.7"]) == "10.0.0.7"
    assert client_address("10.0.0.2", LB, [None], ["203.0.113.9"]) == "203.0.113.9"


def test_all_hops_trusted_gives_the_left_most() -> None:
    assert client_address("10.0.0.2", LB, [], ["10.9.9.9", "10.0.0.7"]) == "10.9.9.9"
    assert client_address("10.0.0.2", LB, [], []) == "10.0.0.2"


def test_bad_cidr_names_itself() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        TrustedProxies.parse(["10.0.0.0/8", "10.0.0.0/33"])
    assert TrustedProxies.parse(["127.0.0.1"]).trusts(parse_ip("127.0.0.1"))  # type: ignore[arg-type]
