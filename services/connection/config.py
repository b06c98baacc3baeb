"""Settings of the connection service (env `STARLING_*`, TOML table `[connection]`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from services.common.config import ServiceSettings


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
    max_packet_size_bytes: int = Field(default=1 << 20, ge=64, le=268_435_460)
    receive_maximum: int = Field(default=1024, ge=1, le=65535)
    topic_alias_maximum: int = Field(default=64, ge=0, le=65535)
    max_keepalive_s: int = Field(default=0, ge=0, le=65535, description="0: no cap.")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    v3_inflight: int = Field(
        default=256, ge=1, le=65535, description="Outbound QoS 1/2 window for 3.1/3.1.1 clients."
    )
    max_queued_messages: int = Field(default=1000, ge=0)
    max_topic_length_bytes: int = Field(default=4096, ge=1, le=65535)
    max_topic_levels: int = Field(default=32, ge=1, le=1024)
    max_connections_per_ip: int = Field(
        default=1000,
        ge=0,
        description="Open connections from one IP address to one node; a CONNECT beyond it "
        "gets CONNACK 0x97 (3.1.1: 3). Raise it behind NAT or a load balancer; 0: no cap.",
    )
    stats_interval_s: float = Field(
        default=5.0, gt=0, description="How often the node reports its counters to metrics."
    )

    @model_validator(mode="after")
    def _tls_files(self) -> ConnectionSettings:
        if (self.tls_port >= 0 or self.wss_port >= 0) and not (
            self.tls_cert_file and self.tls_key_file
        ):
            raise ValueError("tls_port/wss_port need tls_cert_file and tls_key_file")
        return self
