"""GatewayStats: per-tenant counters of what the gateway took in and delivered, reported to
the metrics service like a node's (reporter kind `gateway`), so `starling stats`, the cluster
Prometheus endpoint and `$SYS` count HTTP and CoAP traffic with the MQTT traffic."""

from __future__ import annotations

from services.common.message_size import message_bytes
from services.metrics.client import TenantCounters

KIND = "gateway"


class GatewayStats:
    def __init__(self) -> None:
        self._tenants: dict[str, TenantCounters] = {}

    def _of(self, tenant: str) -> TenantCounters:
        c = self._tenants.get(tenant)
        if c is None:
            c = self._tenants[tenant] = TenantCounters(tenant=tenant)
        return c

    def published(self, tenant: str, qos: int, topic: str, payload: bytes) -> None:
        c = self._of(tenant)
        c.messages_in += 1
        c.packets_in += 1
        c.bytes_in += message_bytes(topic, payload)
        if qos == 0:
            c.msgs_in_q0 += 1
        elif qos == 1:
            c.msgs_in_q1 += 1
        else:
            c.msgs_in_q2 += 1

    def delivered(self, tenant: str, qos: int, topic: str, payload: bytes) -> None:
        c = self._of(tenant)
        c.messages_out += 1
        c.bytes_out += message_bytes(topic, payload)
        if qos == 0:
            c.msgs_out_q0 += 1
        elif qos == 1:
            c.msgs_out_q1 += 1
        else:
            c.msgs_out_q2 += 1

    def refused_by_quota(self, tenant: str) -> None:
        self._of(tenant).quota_refusals += 1

    def clients(self, tenant: str, delta: int) -> None:
        """A CoAP client registered (+1) or went (-1)."""
        c = self._of(tenant)
        c.connections += delta
        if delta > 0:
            c.connects += 1

    def gather(self) -> list[TenantCounters]:
        return list(self._tenants.values())
