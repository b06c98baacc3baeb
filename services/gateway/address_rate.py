"""AddressRate: requests per client address in one-second windows (pure: the caller passes
`now`), for the HTTP API's `gateway_requests_per_ip_per_s` and CoAP's
`gateway_coap_messages_per_ip_per_s`.

Memory is bounded by the addresses seen in the current second (every window starts empty),
and by `max_addresses` within one second: an address beyond it is refused, so a flood of
spoofed sources cannot grow the table (a real client is refused for at most a second).
"""

from __future__ import annotations

import math


class AddressRate:
    def __init__(self, per_s: int, max_addresses: int = 100_000) -> None:
        """`per_s` 0: no cap (every call admits)."""
        self._per_s = per_s
        self._max = max_addresses
        self._window = -1
        self._counts: dict[str, int] = {}

    def admit(self, address: str, now: float) -> float | None:
        """None: admitted (and counted); else the seconds until the address may try again."""
        if self._per_s <= 0:
            return None
        window = math.floor(now)
        if window != self._window:
            self._window, self._counts = window, {}
        count = self._counts.get(address, 0)
        if count >= self._per_s or (not count and len(self._counts) >= self._max):
            return max(0.001, window + 1 - now)
        self._counts[address] = count + 1
        return None
