"""Settings of the connection service (env `STARLING_*`, TOML table `[connection]`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from services.common.config import ServiceSettings, existing_file
from services.common.connect import WILL_STORE_LIMIT_BYTES, WILL_STORE_MAX_BYTES
from services.common.forwarded import TrustedProxies
from services.common.mqtt.errors import MqttError
from services.common.topics import validate_topic_name


class Redirect(BaseModel):
    """Where the clients of one tenant should connect instead (MQTT 5 Server Reference)."""

    server_reference: str = Field(min_length=1, description="e.g. `b.example.com:1883`")
    moved: bool = Field(default=False, description="true: 0x9D Server moved; false: 0x9C.")


class ConnectionSettings(ServiceSettings):
    service_name: ClassVar[str] = "connection"
    grpc_port: int = Field(default=7010, ge=0, le=65535, description="gRPC port; 0 picks one.")

    mqtt_host: str = Field(default="0.0.0.0", description="Address the MQTT listeners bind.")
    mqtt_port: int = Field(default=1883, ge=0, le=65535, description="MQTT over TCP; 0 picks.")
    ws_port: int = Field(default=-1, ge=-1, le=65535, description="MQTT over WebSocket; -1 off.")
    ws_path: str = Field(default="/mqtt", pattern="^/")
    tls_port: int = Field(default=-1, ge=-1, le=65535, description="MQTT over TLS; -1 off.")
    wss_port: int = Field(default=-1, ge=-1, le=65535, description="MQTT over WSS; -1 off.")
    tls_cert_file: Path | None = Field(default=None, description="PEM server certificate.")
    tls_key_file: Path | None = Field(default=None, description="PEM private key.")
    tls_ca_file: Path | None = Field(default=None, description="CA for client certificates.")
    tls_require_client_cert: bool = False
    reuse_port: bool = Field(
        default=False,
        description="Bind the MQTT listeners (TCP, TLS, WS, WSS) with SO_REUSEPORT, so several "
        "node processes on one host share the same ports and the kernel spreads connections "
        "among them (`starling up --node-workers N` sets it). Each process needs its own "
        "node_id, and the ports must be fixed (not 0). Any process of the same user can then "
        "bind these ports too.",
    )
    max_connect_packet_size_bytes: int = Field(
        default=64 << 10,
        ge=64,
        le=268_435_460,
        description="Largest packet accepted until the CONNECT is accepted (CONNECT and "
        "what comes before its CONNACK); larger: CONNACK 0x95 (MQTT 5) or close. "
        "At most max_packet_size_bytes.",
    )
    max_user_properties: int = Field(
        default=256,
        ge=1,
        le=65535,
        description="User properties per property block of one packet (and Subscription "
        "Identifiers, counted apart); more: 0x97 (CONNACK or DISCONNECT), close on 3.1.1.",
    )
    max_filters_per_subscribe: int = Field(
        default=100,
        ge=1,
        le=65535,
        description="Topic filters in one SUBSCRIBE or UNSUBSCRIBE; more: DISCONNECT 0x97 "
        "(MQTT 5) or close, before the rest of the packet is read.",
    )
    max_subscriptions_per_client: int = Field(
        default=1000,
        ge=1,
        description="Subscriptions one client may hold; a filter beyond gets SUBACK 0x97 "
        "(MQTT 5) or 0x80 (3.1.1).",
    )
    receive_maximum: int = Field(default=1024, ge=1, le=65535)
    topic_alias_maximum: int = Field(default=64, ge=0, le=65535)
    outbound_topic_alias_maximum: int = Field(
        default=64,
        ge=0,
        le=65535,
        description="Topic aliases a node sets up towards one MQTT 5 client at most, whatever "
        "Topic Alias Maximum the client allows: each holds a topic name in the node's memory "
        "(65,535 aliases of 4 KiB topics would be 256 MiB for one connection). 0: none.",
    )
    max_keepalive_s: int = Field(
        default=3600,
        ge=0,
        le=65535,
        description="Longest keep alive granted: MQTT 5 clients asking more get it as Server "
        "Keep Alive; 3.1.1 clients asking more are closed after 1.5 times it of silence. "
        "0: no cap.",
    )
    server_keepalive_s: int = Field(
        default=3600,
        ge=0,
        le=65535,
        description="Server Keep Alive imposed on MQTT 5 clients that ask for none (0). "
        "3.1.1 clients cannot be told: keep alive 0 stays off for them (TCP keep-alive "
        "finds their dead peers). 0: MQTT 5 clients may turn it off too.",
    )
    connect_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="A connection must deliver its whole CONNECT within this many seconds "
        "of opening (TCP/TLS handshake or WebSocket upgrade done), or it is closed.",
    )
    auto_subscribe_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="The CONNACK of a client its tenant's auto-subscriptions apply to waits "
        "until they are in place on the mesh (NATS subscriptions, mesh interest confirmed, a "
        "persistent session's stored subscriptions), as a SUBACK does, for at most this "
        "long; past it (or when they fail) the CONNECT is refused with 0x88 Server "
        "unavailable (3.1.1: return code 3) and the client retries (docs/rules.md).",
    )
    tcp_keepalive_idle_s: int = Field(
        default=60,
        ge=0,
        le=32767,
        description="TCP keep-alive on accepted sockets (TCP, TLS, WS, WSS): idle seconds "
        "before the first probe. 0: TCP keep-alive off.",
    )
    tcp_keepalive_interval_s: int = Field(
        default=15, ge=1, le=32767, description="Seconds between TCP keep-alive probes."
    )
    tcp_keepalive_count: int = Field(
        default=4, ge=1, le=127, description="Unanswered TCP keep-alive probes before close."
    )
    v3_inflight: int = Field(
        default=256, ge=1, le=65535, description="Outbound QoS 1/2 window for 3.1/3.1.1 clients."
    )
    max_queued_messages: int = Field(
        default=1000,
        ge=0,
        description="QoS 1/2 messages a connection holds in memory for a client that is "
        "behind (clean sessions; a persistent session's wait in its durable queue).",
    )
    max_queued_bytes: int = Field(
        default=16 << 20,
        ge=0,
        description="Bytes (payload and topic) of those queued messages; past either limit "
        "new QoS 1/2 messages for that connection are dropped and counted. Keep it at least "
        "max_packet_size_bytes, or a large message that has to wait is always dropped.",
    )
    control_packets_per_s: float = Field(
        default=1000.0,
        ge=0,
        description="Per connection: packets other than PUBLISH, DISCONNECT and acks of an "
        "exchange under way (PINGREQ, SUBSCRIBE, UNSUBSCRIBE, AUTH, acks of unknown packet "
        "ids) refill at this rate; past the burst, DISCONNECT 0x96 (Message rate too high; "
        "3.1.1: closed). Such a flood would otherwise hold the node's event loop. 0: no limit.",
    )
    control_packets_burst: int = Field(
        default=2000,
        ge=1,
        description="Control packets a connection may send at once before the rate applies "
        "(a client subscribing to many filters one SUBSCRIBE each at connect); at least "
        "max_subscriptions_per_client.",
    )
    slow_consumer_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A connection whose socket stays over its write buffer's high-water "
        "mark this long is disconnected (MQTT 5: DISCONNECT 0x97).",
    )
    max_topic_length_bytes: int = Field(
        default=4096,
        ge=1,
        le=65535,
        description="Longest topic name or filter (UTF-8 bytes; a $share filter's inner "
        "filter) in PUBLISH, will, SUBSCRIBE, UNSUBSCRIBE; longer: 0x90 / 0x8F.",
    )
    max_topic_levels: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Most levels in a topic name or filter; more: 0x90 / 0x8F.",
    )
    max_connections_per_ip: int = Field(
        default=1000,
        ge=0,
        description="Open connections from one IP address to one node; a CONNECT beyond it "
        "gets CONNACK 0x97 (3.1.1: 3). Raise it behind NAT or a load balancer; 0: no cap.",
    )
    proxy_protocol: bool = Field(
        default=False,
        description="The TCP and TLS listeners expect a PROXY protocol header (v1 or v2, "
        "before TLS) first on every connection and take the client's address from it "
        "(docs/load-balancers.md); a connection without a valid one is closed at once.",
    )
    proxy_header_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="Time to deliver the PROXY header, or closed."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="CIDRs of HTTP proxies in front of the WebSocket listeners: a request "
        "from one of them takes its client address from `Forwarded: for=`, else the "
        "right-most untrusted `X-Forwarded-For` entry; others' headers are ignored. JSON "
        'in the env, e.g. `["10.0.0.0/8"]`.',
    )
    will_store_max_bytes: int = Field(
        default=WILL_STORE_MAX_BYTES,
        ge=0,
        le=WILL_STORE_LIMIT_BYTES,
        description="Largest will (its envelope) a CONNECT hands to the session service, which "
        "keeps it and publishes it if this node dies; a larger one only this node publishes. "
        "0: none handed over. The session service has the same setting; give both one value.",
    )
    mesh_interest_window_s: float = Field(
        default=2.0,
        ge=0,
        lt=4.0,
        description="Nodes skip putting a tenant's messages on NATS while no other node "
        "subscribes to that tenant (services/connection/interest.py): a node trusts what it "
        "knows of the others only if that was confirmed within this window, and the first "
        "subscription of a tenant on a node gets its SUBACK once every other node confirmed "
        "it, or after this window (plus 10%) at most. Below 4 s (twice the 2 s state "
        "period); 0: every message goes on NATS.",
    )
    rule_filters_resync_s: float = Field(
        default=30.0,
        gt=0,
        description="How often the node asks the rules service for every tenant's rule "
        "filters again (changes also arrive as they happen): a change the node missed, or a "
        "node started while no rules instance answered, is caught up within this period "
        "(docs/rules.md, Guarantees).",
    )
    route_copy_max_subscriptions: int = Field(
        default=100_000,
        ge=0,
        description="Persistent subscriptions this node may copy from the router's route "
        "table, over all tenants, to send QoS>=1 publishes straight to the queues (a tenant "
        "beyond it is routed by the router); 0: every such publish goes through the router.",
    )
    quota_enabled: bool = Field(
        default=True,
        description="Enforce the tenant and user rate limits of the quota service (`starling "
        "quota set`) on publishes: local token buckets filled by leases, no call per message "
        "(docs/quota.md); and tenants' `max_subscriptions_per_client` (a copy of the limits, "
        "refreshed on change). false: neither on this node.",
    )
    quota_unavailable: Literal["keep", "allow", "deny"] = Field(
        default="keep",
        description="While the quota service cannot be reached: `keep` grants each limited "
        "budget, per second, what this node was last granted in a whole window, at most the "
        "limit divided by the nodes the quota service counted for it (so all nodes together "
        "stay within the limit; tenants never answered for are admitted); `allow` admits "
        "every publish; `deny` refuses "
        "the publishes of limited tenants and of tenants not known yet. Retried every second.",
    )
    quota_lease_slices: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="A node asks for at most 1/N of a tenant's per-second limit at a time "
        "(less when its recent demand is lower), so nodes that all want more share each "
        "window; more slices: fairer, more lease calls.",
    )
    ban_sync_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the node re-reads the ban list from the quota service (each "
        "change also comes at once over NATS); a lost announcement is late by at most this.",
    )
    reason_strings: bool = Field(
        default=True,
        description="Explain refusals to MQTT 5 clients with a Reason String (CONNACK, "
        "PUBACK/PUBREC, SUBACK, UNSUBACK, DISCONNECT).",
    )
    response_information: str = Field(
        default="$response/{client_id}",
        description="Response Information for MQTT 5 clients that request it: a topic prefix "
        "for their response topics; `{client_id}` becomes the client id; empty: none.",
    )
    redirects: dict[str, Redirect] = Field(
        default_factory=dict,
        description="Tenant -> {server_reference, moved}: its clients are refused with "
        "CONNACK 0x9D (moved: true) or 0x9C (Use another server) naming server_reference. "
        'JSON in the env, e.g. `{"acme": {"server_reference": "b.example:1883"}}`.',
    )

    drain_server_reference: str = Field(
        default="",
        max_length=1024,
        description="Where MQTT 5 clients of a draining node (`starling drain`) are sent: the "
        "Server Reference of their DISCONNECT 0x9C, e.g. the load balancer's `mqtt.example:"
        "1883`. A drain request may name another; empty and none named: 0x9C without one.",
    )
    drain_rate_per_s: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="Connections a draining node closes per second (MQTT 5 first): the "
        "reconnect wave the other nodes and the session service take.",
    )
    drain_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="A draining node closes whatever is still open this long after the "
        "drain began, then exits. Keep it above connections / drain_rate_per_s (and "
        "Kubernetes' terminationGracePeriodSeconds above it).",
    )

    close_linger_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="A connection the node closes (DISCONNECT of any reason, a drain, a refused "
        "CONNECT) is half-closed once its last packet is written, and its input read and "
        "dropped until the client closes, at most this long: closing with unread input would "
        "reset the socket and lose that last packet.",
    )
    close_linger_max_sockets: int = Field(
        default=10_000,
        ge=0,
        le=10_000_000,
        description="At most this many connections linger at once (close_linger_s); past it, "
        "one is closed at once (its client may see a reset instead of its DISCONNECT).",
    )
    close_ack_wait_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="A draining or stopping node stops reading a client, then waits at most "
        "this long for the acks it still owes it (PUBACK/PUBREC of publishes being stored, "
        "PUBCOMP of releases being written) before its DISCONNECT.",
    )
    self_fence_s: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="A node whose heartbeats no session instance answered for this long "
        "fences itself: every client gets DISCONNECT 0x9C, a CONNECT CONNACK 0x88, gRPC "
        "health turns NOT_SERVING, until answers resume (services/connection/lease.py). "
        "Must be well below the session service's node_timeout_s (10 s), after which its "
        "clients are released; 0: never fence.",
    )

    _files = field_validator("tls_cert_file", "tls_key_file", "tls_ca_file")(existing_file)

    @field_validator("response_information")
    @classmethod
    def _response_information(cls, template: str) -> str:
        """A prefix clients can publish to: a valid topic name outside `$SYS`."""
        if not template:
            return template
        topic = template.replace("{client_id}", "c")
        try:
            validate_topic_name(topic)
        except MqttError as exc:
            raise ValueError(f"not a usable topic prefix: {exc}") from None
        if topic == "$SYS" or topic.startswith("$SYS/"):
            raise ValueError("$SYS topics are refused to clients")
        return template

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, cidrs: list[str]) -> list[str]:
        TrustedProxies.parse(cidrs)  # ValueError naming the entry
        return cidrs

    @model_validator(mode="after")
    def _limits(self) -> ConnectionSettings:
        if self.max_connect_packet_size_bytes > self.max_packet_size_bytes:
            raise ValueError("max_connect_packet_size_bytes exceeds max_packet_size_bytes")
        if self.max_keepalive_s and self.server_keepalive_s > self.max_keepalive_s:
            raise ValueError("server_keepalive_s exceeds max_keepalive_s")
        if self.control_packets_per_s and (
            self.control_packets_burst < self.max_subscriptions_per_client
        ):
            # A client subscribing one filter per SUBSCRIBE at connect would be cut off,
            # reconnect, and be cut off again.
            raise ValueError("control_packets_burst is below max_subscriptions_per_client")
        return self

    @model_validator(mode="after")
    def _reuse_port(self) -> ConnectionSettings:
        # Port 0 would give each process a port of its own: nothing would be shared.
        if self.reuse_port:
            zero = [
                name
                for name in ("mqtt_port", "ws_port", "tls_port", "wss_port")
                if getattr(self, name) == 0
            ]
            if zero:
                raise ValueError(f"reuse_port needs fixed ports; {', '.join(zero)} is 0")
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> ConnectionSettings:
        if (self.tls_port >= 0 or self.wss_port >= 0) and not (
            self.tls_cert_file and self.tls_key_file
        ):
            raise ValueError("tls_port/wss_port need tls_cert_file and tls_key_file")
        return self
