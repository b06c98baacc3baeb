"""Settings of the queue service (env `STARLING_*`, TOML table `[queue]`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from services.common.config import ServiceSettings
from services.queue.link import parse_address


class QueueSettings(ServiceSettings):
    service_name: ClassVar[str] = "queue"
    grpc_port: int = Field(default=7003, ge=0, le=65535, description="gRPC port; 0 picks one.")
    queue_partitions: int = Field(default=64, ge=1, le=65536, description="Fixed partition count.")
    instance_index: int = Field(
        default=0,
        ge=0,
        description="This instance's index among `instance_count` (what the route fence "
        "waits for before any ownership announcement was heard; partitions are leased).",
    )
    instance_count: int = Field(default=1, ge=1, description="Queue instances in the cluster.")
    queue_lease_ttl_ms: int = Field(
        default=1200,
        ge=200,
        le=60_000,
        description="Lease of an instance on its partitions (in Redis), renewed every quarter "
        "of it: a dead instance's partitions move to the others within about 1.25 times this.",
    )
    queue_lease_key_prefix: str = Field(
        default="starling:queue:",
        min_length=1,
        description="Prefix of the Redis keys of the partition leases (one per queue cluster "
        "sharing a Redis).",
    )
    grpc_advertise_address: str = Field(
        default="",
        description="host:port at which other services reach this instance's gRPC (calls "
        "too large for NATS go to a partition's owner there); default grpc_host:grpc_port, or this "
        "host's address when grpc_host is 0.0.0.0.",
    )
    link_enabled: bool = Field(
        default=True,
        description="Serve the queue link: connection nodes send their appends, reads and acks "
        "to this instance over a TCP connection of their own instead of NATS request/reply, and "
        "get pushed entries on it (services/queue/link.py); off: all of it over NATS.",
    )
    link_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of the queue link (on grpc_host); 0 picks one. Instances announce it, "
        "so nodes need no setting.",
    )
    link_advertise_address: str = Field(
        default="",
        description="host:port at which nodes reach the queue link; default grpc_host and the "
        "bound port, or this host's address when grpc_host is 0.0.0.0.",
    )

    @field_validator("link_advertise_address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        if v:
            parse_address(v)  # ValueError names the setting
        return v

    max_queue_depth: int = Field(
        default=1_000_000,
        ge=0,
        description="Entries per session queue; 0: no cap. Past it `depth_policy` applies.",
    )
    depth_policy: Literal["drop_oldest", "reject_newest"] = "drop_oldest"
    quota_enabled: bool = Field(
        default=True,
        description="Enforce tenants' `max_queue_depth` and `max_queued_bytes` (`starling "
        "quota set`; the depth below "
        "`max_queue_depth` here): an append past it is refused (the publisher gets PUBACK "
        "0x97), not dropped. Limits are copies refreshed on change (docs/quota.md).",
    )
    notice_max_bytes: int = Field(
        default=65536,
        ge=0,
        le=1_048_576,
        description="Largest total size of an append's new entries that the queue pushes, "
        "inside its notice, to a reader that is caught up (saves that reader a read); larger "
        "appends are read back. 0: never push.",
    )

    queue_depth_resync_s: float = Field(
        default=300.0,
        gt=0,
        description="Every this many seconds the instance scans the store's queue state "
        "once (every queue with entries) to refresh its per-tenant queue depths "
        "(starling_cluster_queue_depth); between scans it adds the depth change of each of "
        "its appends, acks and drops. The scan takes in what it did not see: the compaction "
        "job's expired entries, an ack served by an instance that does not own the queue.",
    )

    queued_bytes_share_s: float = Field(
        default=1.0,
        gt=0,
        description="Every this many seconds the instance announces on NATS the bytes its "
        "partitions' queues hold per tenant; each instance checks a tenant's "
        "`max_queued_bytes` against its own exact figure plus the others' last ones, so the "
        "cluster may pass the limit by what the other instances took in one period "
        "(docs/quota.md).",
    )

    @model_validator(mode="after")
    def _index(self) -> QueueSettings:
        if self.instance_index >= self.instance_count:
            raise ValueError("instance_index must be below instance_count")
        return self
